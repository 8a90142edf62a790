//! The bootstrap every cloud provider gives a new instance (EC2 and Lambda user-data, a GCE
//! startup-script, Azure customData): a shell script, run once at first boot,
//! that installs `switchyard-agent` and starts it as a systemd service enrolled with this
//! launch's broker URL and one-time token.
//!
//! The token goes into a root-only (0600) environment file read by the unit's
//! `EnvironmentFile=`, never onto a command line (where `ps` would show it). It is still
//! readable through the instance metadata service by anything on the instance until it is
//! used; that is why it is one-time.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Environment variables the provider itself writes into the agent's env file; `agent.env`
/// may not override them.
pub const RESERVED_AGENT_ENV: [&str; 5] = [
    "SWITCHYARD_BROKER",
    "SWITCHYARD_ENROL_TOKEN",
    "SWITCHYARD_STATE_DIR",
    "SWITCHYARD_AGENT_NAME",
    "SWITCHYARD_CA_CERT",
];

/// How the instance gets and starts `switchyard-agent` (cloud-init user-data). The broker URL
/// and the enrolment token come with each launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentInstall {
    /// Where to download the agent binary from (curl), or…
    #[serde(default)]
    pub download_url: Option<String>,
    /// …the SHA-256 (hex) the download must have.
    #[serde(default)]
    pub sha256: Option<String>,
    /// …a shell command that installs the binary at `binary_path` (e.g. from a package).
    #[serde(default)]
    pub install_command: Option<String>,
    #[serde(default = "default_binary_path")]
    pub binary_path: String,
    /// Extra `SWITCHYARD_*` settings for the agent (e.g. its interruption-notice URL).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// PEM CA certificate(s) the agent trusts for the broker (its `--ca-cert`), written to
    /// the instance with the env file. The broker fills it from its `agent_ca_cert` file.
    #[serde(default)]
    pub ca_cert_pem: Option<String>,
}

impl AgentInstall {
    /// Checks what can be checked before any launch; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        let fail = |m: String| Err(m);
        match (&self.download_url, &self.install_command) {
            (Some(_), Some(_)) => {
                return fail("agent: give download_url or install_command, not both".into());
            }
            (None, None) => return fail("agent: give download_url or install_command".into()),
            (Some(url), None) if !(url.starts_with("https://") || url.starts_with("http://")) => {
                return fail(format!("agent.download_url {url:?} is not an http(s) URL"));
            }
            (None, Some(_)) if self.sha256.is_some() => {
                return fail("agent.sha256 applies only to download_url".into());
            }
            _ => {}
        }
        if let Some(sum) = &self.sha256
            && (sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return fail("agent.sha256 must be 64 hex digits".into());
        }
        if !self.binary_path.starts_with('/') || !is_plain(&self.binary_path) {
            return fail(format!(
                "agent.binary_path {:?} must be an absolute path without spaces or quotes",
                self.binary_path
            ));
        }
        if let Some(pem) = &self.ca_cert_pem
            && !ca_pem_is_plain(pem)
        {
            return fail(
                "agent.ca_cert_pem must be PEM certificates: printable ASCII lines with a \
                 BEGIN CERTIFICATE block"
                    .into(),
            );
        }
        for (key, value) in &self.env {
            if !key.starts_with("SWITCHYARD_")
                || !key
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            {
                return fail(format!("agent.env: {key:?} is not a SWITCHYARD_* name"));
            }
            if RESERVED_AGENT_ENV.contains(&key.as_str()) {
                return fail(format!("agent.env: {key} is set by the provider"));
            }
            if value.chars().any(char::is_control) {
                return fail(format!("agent.env.{key} contains a control character"));
            }
        }
        Ok(())
    }
}

/// PEM text safe inside the user-data's quoted here document: printable ASCII lines, at
/// least one certificate, no line that could end the document.
pub fn ca_pem_is_plain(pem: &str) -> bool {
    pem.contains("-----BEGIN CERTIFICATE-----")
        && pem
            .bytes()
            .all(|b| b == b'\n' || b == b'\r' || (b' '..=b'~').contains(&b))
        && !pem.lines().any(|l| l.trim().starts_with("SWITCHYARD_"))
}

/// Safe to write unquoted into a shell script and a systemd unit.
pub fn is_plain(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@".contains(&b))
}
fn default_binary_path() -> String {
    "/usr/local/bin/switchyard-agent".into()
}

pub const ENV_FILE: &str = "/etc/switchyard/agent.env";
pub const UNIT_NAME: &str = "switchyard-agent.service";
pub const CA_FILE: &str = "/etc/switchyard/ca.pem";
const STATE_DIR: &str = "/var/lib/switchyard-agent";

/// What one launch puts into the script.
#[derive(Debug)]
pub struct Enrolment<'a> {
    pub broker_url: &'a str,
    pub token: &'a str,
    pub agent_name: &'a str,
}

/// A value that cannot go into the env file as it is.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0} contains a control character")]
pub struct BadValue(pub &'static str);

/// The script, as text (the caller base64-encodes it for `RunInstances`).
pub fn render(agent: &AgentInstall, enrolment: &Enrolment<'_>) -> Result<String, BadValue> {
    let mut env = String::new();
    for (key, value, what) in [
        ("SWITCHYARD_BROKER", enrolment.broker_url, "broker URL"),
        ("SWITCHYARD_ENROL_TOKEN", enrolment.token, "enrolment token"),
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
            let pem = pem.trim_end();
            format!(
                "cat > \"$R{CA_FILE}\" <<'SWITCHYARD_CA_EOF'\n{pem}\nSWITCHYARD_CA_EOF\nchmod 0644 \"$R{CA_FILE}\"\necho \"SWITCHYARD_CA_CERT=\\\"$R{CA_FILE}\\\"\" >> \"$R{ENV_FILE}\"\n"
            )
        }
        Some(_) => return Err(BadValue("agent.ca_cert_pem")),
        None => String::new(),
    };
    let binary = &agent.binary_path;
    let install = match (&agent.download_url, &agent.install_command) {
        (Some(url), _) => {
            let mut s = format!(
                "curl -fsSL --retry 10 --retry-all-errors --retry-delay 3 -o \"$R{binary}.download\" {}\n",
                shell_quote(url)
            );
            if let Some(sum) = &agent.sha256 {
                let _ = writeln!(s, "echo \"{sum}  $R{binary}.download\" | sha256sum -c -");
            }
            let _ = writeln!(s, "install -m 0755 \"$R{binary}.download\" \"$R{binary}\"");
            let _ = writeln!(s, "rm -f \"$R{binary}.download\"");
            s
        }
        (None, Some(command)) => format!("{command}\n"),
        (None, None) => String::new(),
    };
    debug_assert!(is_plain(binary), "validated by AgentInstall::validate");
    Ok(format!(
        r#"#!/bin/bash
# Switchyard: install and start switchyard-agent (written by the broker's cloud provider).
# SWITCHYARD_BOOT_ROOT is unset on a real instance; Switchyard's test clouds set it to run an
# "instance" as a sandbox directory treated as /.
set -euo pipefail
umask 077
R="${{SWITCHYARD_BOOT_ROOT:-}}"
install -d -m 0700 "$R/etc/switchyard" "$R{STATE_DIR}"
cat > "$R{ENV_FILE}" <<'SWITCHYARD_ENV_EOF'
{env}SWITCHYARD_ENV_EOF
echo "SWITCHYARD_STATE_DIR=\"$R{STATE_DIR}\"" >> "$R{ENV_FILE}"
# Other nodes (a multi-node job's ranks, the gateway) reach this one at its first address.
if [ -z "$R" ] && ! grep -q '^SWITCHYARD_ADVERTISE_HOST=' "$R{ENV_FILE}"; then
  ip="$(hostname -I 2>/dev/null | awk '{{print $1}}')"
  if [ -n "$ip" ]; then echo "SWITCHYARD_ADVERTISE_HOST=\"$ip\"" >> "$R{ENV_FILE}"; fi
fi
chmod 0600 "$R{ENV_FILE}"
{ca}install -d -m 0755 "$(dirname "$R{binary}")" "$R/etc/systemd/system"
{install}cat > "$R/etc/systemd/system/{UNIT_NAME}" <<SWITCHYARD_UNIT_EOF
[Unit]
Description=Switchyard edge agent
Wants=network-online.target
After=network-online.target

[Service]
EnvironmentFile=$R{ENV_FILE}
ExecStart=$R{binary}
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

    /// Runs `script` with bash under a fresh directory as its root, with a `systemctl` that
    /// records its arguments; returns the root.
    fn run_in_sandbox(script: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("tempdir");
        let bin = root.path().join("shim");
        std::fs::create_dir_all(&bin).expect("shim dir");
        let shim = bin.join("systemctl");
        std::fs::write(
            &shim,
            "#!/bin/sh\necho \"$@\" >> \"$SWITCHYARD_BOOT_ROOT/systemctl.log\"\n",
        )
        .expect("shim");
        std::process::Command::new("chmod")
            .args(["+x"])
            .arg(&shim)
            .status()
            .expect("chmod");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(script)
            .env("SWITCHYARD_BOOT_ROOT", root.path())
            .env("PATH", path)
            .output()
            .expect("bash");
        assert!(
            out.status.success(),
            "the script failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        root
    }

    fn read(root: &tempfile::TempDir, path: &str) -> String {
        std::fs::read_to_string(root.path().join(path.trim_start_matches('/')))
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn a_broker_ca_is_written_to_a_file_the_agent_trusts() {
        let mut a = local_install();
        let pem = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
        a.ca_cert_pem = Some(pem.into());
        let root = run_in_sandbox(&render(&a, &enrolment("t")).expect("script"));
        assert_eq!(read(&root, CA_FILE), pem);
        let ca_line = format!(
            "SWITCHYARD_CA_CERT=\"{}{CA_FILE}\"\n",
            root.path().display()
        );
        assert!(read(&root, ENV_FILE).contains(&ca_line));
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

    /// Installs by copying a file that stands for the agent binary.
    fn local_install() -> AgentInstall {
        let mut a = agent();
        a.download_url = None;
        a.sha256 = None;
        a.install_command =
            Some("printf '#!/bin/sh\\n' > \"$R/usr/local/bin/switchyard-agent\"".into());
        a
    }

    #[test]
    fn the_script_installs_the_agent_and_keeps_the_token_off_the_command_line() {
        let script = render(&agent(), &enrolment("tok-123")).expect("script");
        assert!(script.starts_with("#!/bin/bash\n"));
        assert!(script.contains("curl -fsSL"));
        assert!(script.contains("sha256sum -c -"));

        let root =
            run_in_sandbox(&render(&local_install(), &enrolment("tok-123")).expect("script"));
        let r = root.path().display().to_string();
        let env = read(&root, ENV_FILE);
        for line in [
            "SWITCHYARD_BROKER=\"https://broker.example.com:8080\"".to_string(),
            "SWITCHYARD_ENROL_TOKEN=\"tok-123\"".to_string(),
            "SWITCHYARD_AGENT_NAME=\"inst-1\"".to_string(),
            "SWITCHYARD_INTERRUPTION_URL=\"http://169.254.169.254/latest/meta-data/spot/instance-action\"".to_string(),
            format!("SWITCHYARD_STATE_DIR=\"{r}/var/lib/switchyard-agent\""),
        ] {
            assert!(env.lines().any(|l| l == line), "{line} not in\n{env}");
        }
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(root.path().join(ENV_FILE.trim_start_matches('/')))
            .expect("env file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let unit = read(&root, &format!("/etc/systemd/system/{UNIT_NAME}"));
        assert!(
            unit.contains(&format!("EnvironmentFile={r}{ENV_FILE}\n")),
            "{unit}"
        );
        assert!(unit.contains(&format!("ExecStart={r}/usr/local/bin/switchyard-agent\n")));
        assert!(!unit.contains("tok-123"));
        assert_eq!(
            read(&root, "/systemctl.log"),
            format!("daemon-reload\nenable --now {UNIT_NAME}\n")
        );
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
