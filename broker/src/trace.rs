//! Joining a job's trace: the submit span's W3C context is stored with the job; spans the
//! broker opens later for that job (placement, launch, the agent's report) become its
//! children, and the agent's run span joins it through the lease. A no-op, without a database
//! read, unless traces are exported (`OTEL_EXPORTER_OTLP_ENDPOINT`).

use switchyard_core::JobId;
use switchyard_support::telemetry;

use crate::state::App;

/// Makes `span` a child of `job`'s trace.
pub async fn join_job(app: &App, span: &tracing::Span, job: JobId) {
    if !telemetry::enabled() {
        return;
    }
    match app.store.job_trace_parent(job).await {
        Ok(tp) => telemetry::set_parent(span, tp.as_deref()),
        Err(e) => tracing::debug!(error = %e, job.id = %job, "no trace context for the job"),
    }
}
