//! What the broker (`switchyard`) and the agent (`switchyard-agent`) both need around their own
//! work, so that neither depends on the other for it: logging and OpenTelemetry set-up with the
//! W3C trace context a job's trace crosses processes with ([`telemetry`]), and the settings of
//! the HTTP clients that talk to a broker — the CLI's and the agent's ([`http`]).

pub mod http;
pub mod telemetry;
