//! The cloud-init user-data of a Switchyard instance: a shell script, run once at first boot,
//! that installs `switchyard-agent` and starts it as a systemd service enrolled with this
//! launch's broker URL and one-time token.
//!
//! The token goes into a root-only (0600) environment file read by the unit's
//! `EnvironmentFile=`, never onto a command line (where `ps` would show it). It is still
//! readable through the instance metadata service by anything on the instance until it is
//! used; that is why it is one-time.

use super::config::{AgentInstall, ca_pem_is_plain, is_plain};
use std::fmt::Write as _;

pub(crate) const ENV_FILE: &str = "/etc/switchyard/agent.env";
pub(crate) const UNIT_NAME: &str = "switchyard-agent.service";
pub(crate) const CA_FILE: &str = "/etc/switchyard/ca.pem";
const STATE_DIR: &str = "/var/lib/switchyard-agent";

/// What one launch puts into the script.
#[derive(Debug)]
pub(crate) struct Enrolment<'a> {
    pub broker_url: &'a str,
    pub token: &'a str,
    pub agent_name: &'a str,
}

/// A value that cannot go into the env file as it is.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} contains a control character")]
pub(crate) struct BadValue(pub &'static str);

/// The script, as text (the caller base64-encodes it for `RunInstances`).
pub(crate) fn render(agent: &AgentInstall, enrolment: &Enrolment<'_>) -> Result<String, BadValue> {
    let mut env = String::new();
    for (key, value, what) in [
        ("SWITCHYARD_BROKER", enrolment.broker_url, "broker URL"),
        ("SWITCHYARD_ENROL_TOKEN", enrolment.token, "enrolment token"),
        ("SWITCHYARD_STATE_DIR", STATE_DIR, "state dir"),
        (
            "SWITCHYARD_AGENT_NAME",
            enrolment.agent_name,
            "instance key",
        ),
    ] {
        env_line(&mut env, key, value).map_err(|()| BadValue(what))?;
    }
    for (key, value) in &agent.env {
        env_line(&mut env, key, value).map_err(|()| BadValue("agent.env"))?;
    }
    // The broker's private CA, when it has one: a file the agent's --ca-cert names.
    let ca = match &agent.ca_cert_pem {
        Some(pem) if ca_pem_is_plain(pem) => {
            env_line(&mut env, "SWITCHYARD_CA_CERT", CA_FILE).map_err(|()| BadValue("CA"))?;
            let pem = pem.trim_end();
            format!(
                "cat > {CA_FILE} <<'SWITCHYARD_CA_EOF'\n{pem}\nSWITCHYARD_CA_EOF\nchmod 0644 {CA_FILE}\n"
            )
        }
        Some(_) => return Err(BadValue("agent.ca_cert_pem")),
        None => String::new(),
    };
    let binary = &agent.binary_path;
    let install = match (&agent.download_url, &agent.install_command) {
        (Some(url), _) => {
            let mut s = format!(
                "curl -fsSL --retry 10 --retry-all-errors --retry-delay 3 -o {binary}.download {}\n",
                shell_quote(url)
            );
            if let Some(sum) = &agent.sha256 {
                let _ = writeln!(s, "echo '{sum}  {binary}.download' | sha256sum -c -");
            }
            let _ = writeln!(s, "install -m 0755 {binary}.download {binary}");
            let _ = writeln!(s, "rm -f {binary}.download");
            s
        }
        (None, Some(command)) => format!("{command}\n"),
        (None, None) => String::new(),
    };
    debug_assert!(is_plain(binary), "validated by AwsConfig::validate");
    Ok(format!(
        r#"#!/bin/bash
# Switchyard: install and start switchyard-agent (written by the broker's EC2 provider).
set -euo pipefail
umask 077
install -d -m 0700 /etc/switchyard {STATE_DIR}
cat > {ENV_FILE} <<'SWITCHYARD_ENV_EOF'
{env}SWITCHYARD_ENV_EOF
chmod 0600 {ENV_FILE}
{ca}install -d -m 0755 "$(dirname {binary})"
{install}cat > /etc/systemd/system/{UNIT_NAME} <<'SWITCHYARD_UNIT_EOF'
[Unit]
Description=Switchyard edge agent
Wants=network-online.target
After=network-online.target

[Service]
EnvironmentFile={ENV_FILE}
ExecStart={binary}
Restart=on-failure
RestartSec=5
KillMode=mixed
TimeoutStopSec=60

[Install]
WantedBy=multi-user.target
SWITCHYARD_UNIT_EOF
systemctl daemon-reload
systemctl enable --now {UNIT_NAME}
"#
    ))
}

/// `KEY="value"` in systemd's EnvironmentFile syntax (inside double quotes a backslash
/// escapes `"`, `\` and `$`). Control characters are refused: a newline would end the here
/// document or add a variable.
fn env_line(out: &mut String, key: &str, value: &str) -> Result<(), ()> {
    if value.chars().any(char::is_control) {
        return Err(());
    }
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '"' | '\\' | '$' | '`') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    let _ = writeln!(out, "{key}=\"{escaped}\"");
    Ok(())
}

/// Single-quoted for the shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn agent() -> AgentInstall {
        AgentInstall {
            download_url: Some("https://dl.example.com/switchyard-agent".into()),
            sha256: Some("ab".repeat(32)),
            install_command: None,
            binary_path: "/usr/local/bin/switchyard-agent".into(),
            env: BTreeMap::from([(
                "SWITCHYARD_INTERRUPTION_URL".to_string(),
                "http://169.254.169.254/latest/meta-data/spot/instance-action".to_string(),
            )]),
            ca_cert_pem: None,
        }
    }

    #[test]
    fn a_broker_ca_is_written_to_a_file_the_agent_trusts() {
        let mut a = agent();
        let pem = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
        a.ca_cert_pem = Some(pem.into());
        let script = render(&a, &enrolment("t")).expect("script");
        assert!(script.contains("SWITCHYARD_CA_CERT=\"/etc/switchyard/ca.pem\"\n"));
        assert!(script.contains(
            "cat > /etc/switchyard/ca.pem <<'SWITCHYARD_CA_EOF'\n-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\nSWITCHYARD_CA_EOF\n"
        ));
        assert!(
            !render(&agent(), &enrolment("t"))
                .expect("script")
                .contains("CA_CERT")
        );
        a.ca_cert_pem = Some(format!("{pem}SWITCHYARD_CA_EOF\nrm -rf /\n"));
        assert_eq!(
            render(&a, &enrolment("t")),
            Err(BadValue("agent.ca_cert_pem"))
        );
    }

    fn enrolment<'a>(token: &'a str) -> Enrolment<'a> {
        Enrolment {
            broker_url: "https://broker.example.com:8080",
            token,
            agent_name: "inst-1",
        }
    }

    #[test]
    fn the_script_installs_the_agent_and_keeps_the_token_off_the_command_line() {
        let script = render(&agent(), &enrolment("tok-123")).expect("script");
        assert!(script.starts_with("#!/bin/bash\n"));
        assert!(script.contains("SWITCHYARD_BROKER=\"https://broker.example.com:8080\"\n"));
        assert!(script.contains("SWITCHYARD_ENROL_TOKEN=\"tok-123\"\n"));
        assert!(script.contains("SWITCHYARD_INTERRUPTION_URL=\"http://169.254.169.254/"));
        assert!(script.contains("chmod 0600 /etc/switchyard/agent.env"));
        assert!(script.contains("curl -fsSL"));
        assert!(script.contains("sha256sum -c -"));
        assert!(script.contains("EnvironmentFile=/etc/switchyard/agent.env\n"));
        assert!(script.contains("ExecStart=/usr/local/bin/switchyard-agent\n"));
        assert!(script.contains("systemctl enable --now switchyard-agent.service"));
        let exec = script
            .lines()
            .find(|l| l.starts_with("ExecStart="))
            .expect("ExecStart");
        assert!(!exec.contains("tok-123"));
    }

    #[test]
    fn an_install_command_replaces_the_download() {
        let mut a = agent();
        a.download_url = None;
        a.sha256 = None;
        a.install_command = Some("apt-get install -y switchyard-agent".into());
        let script = render(&a, &enrolment("t")).expect("script");
        assert!(script.contains("\napt-get install -y switchyard-agent\n"));
        assert!(!script.contains("curl"));
    }

    #[test]
    fn values_are_escaped_and_control_characters_refused() {
        let script = render(&agent(), &enrolment(r#"a"b\c$d"#)).expect("script");
        assert!(script.contains(r#"SWITCHYARD_ENROL_TOKEN="a\"b\\c\$d""#));
        assert_eq!(
            render(&agent(), &enrolment("a\nSWITCHYARD_ENV_EOF")),
            Err(BadValue("enrolment token"))
        );
    }
}
