//! Submit-time satisfiability: could any pool in the catalogue ever run this job, capacity and
//! time aside? A job that no pool can ever host is refused at the door (422) instead of waiting
//! forever in the queue: an unknown GPU model, an accelerator no pool has
//! (`resources.accelerator`: `google` where the catalogue has no TPU), a region, a node shape.

use crate::domain::{JobSpec, Pool};
use crate::gpu_model;
use crate::placement::{hard_constraint, model_violation};
use serde::{Deserialize, Serialize};

/// Why no pool can ever host a job; `field` names the spec field to change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{field}: {message}")]
pub struct Unsatisfiable {
    pub field: &'static str,
    pub message: String,
}

/// Checks the spec against every pool's static facts. Deadlines and current load are the
/// planner's business, not this check's.
pub fn check_satisfiable(pools: &[Pool], spec: &JobSpec) -> Result<(), Unsatisfiable> {
    let r = &spec.resources;
    if pools.is_empty() {
        return Err(Unsatisfiable {
            field: "resources",
            message: "the catalogue has no pools".into(),
        });
    }
    if !r.gpu_models.is_empty() {
        let known = r
            .gpu_models
            .iter()
            .find(|m| !pools.iter().any(|p| p.gpu_model.eq_ignore_ascii_case(m)));
        if let Some(unknown) = known {
            let mut models: Vec<&str> = pools.iter().map(|p| p.gpu_model.as_str()).collect();
            models.sort_unstable();
            models.dedup();
            return Err(Unsatisfiable {
                field: "resources.gpu_models",
                message: format!(
                    "unknown GPU model {unknown:?}; the catalogue has {}",
                    models.join(", ")
                ),
            });
        }
    }
    // The accelerator (absent: a GPU) and the model list together: some pool's model passes.
    if !pools
        .iter()
        .any(|p| model_violation(r, &p.gpu_model).is_none())
    {
        let mut models: Vec<String> = pools
            .iter()
            .map(|p| format!("{} ({})", p.gpu_model, gpu_model::vendor(&p.gpu_model)))
            .collect();
        models.sort_unstable();
        models.dedup();
        let asked = match r.accelerator {
            Some(a) => format!("accelerator {:?}", a.as_str()),
            None => "no accelerator (any GPU)".to_string(),
        };
        let with = if r.gpu_models.is_empty() {
            String::new()
        } else {
            format!(" with gpu_models {:?}", r.gpu_models)
        };
        return Err(Unsatisfiable {
            field: "resources.accelerator",
            message: format!(
                "no pool has a model for {asked}{with}; the catalogue has {}",
                models.join(", ")
            ),
        });
    }
    // An empty allow-list (any region) finds nothing here.
    if let Some(unknown) = spec
        .regions
        .iter()
        .find(|reg| !pools.iter().any(|p| &p.region == *reg))
    {
        return Err(Unsatisfiable {
            field: "regions",
            message: format!("no pool in region {unknown}"),
        });
    }
    let max_gpus = pools.iter().map(|p| p.gpus_per_node).max().unwrap_or(0);
    if r.gpus > max_gpus {
        return Err(Unsatisfiable {
            field: "resources.gpus",
            message: format!(
                "{} GPUs on one node, but the largest node in the catalogue has {max_gpus}",
                r.gpus
            ),
        });
    }
    // Every single requirement can be met somewhere; now ask whether one pool meets them all.
    // A gang takes all its nodes in one pool: the pool must be allowed that many.
    let mut first_reason = None;
    let mut most_nodes: Option<u32> = None;
    for pool in pools {
        match hard_constraint(pool, spec) {
            None if pool.node_limit >= r.nodes.max(1) => return Ok(()),
            None => most_nodes = Some(most_nodes.unwrap_or(0).max(pool.node_limit)),
            Some(reason) => {
                first_reason.get_or_insert((pool.id.clone(), reason));
            }
        }
    }
    if let Some(most) = most_nodes {
        return Err(Unsatisfiable {
            field: "resources.nodes",
            message: format!(
                "{} nodes in one pool, but the pools that fit this job allow at most {most}",
                r.nodes
            ),
        });
    }
    let detail = first_reason
        .map(|(pool, why)| format!(" (for example {pool}: {why:?})"))
        .unwrap_or_default();
    Err(Unsatisfiable {
        field: "resources",
        message: format!("no pool meets all of this job's requirements{detail}"),
    })
}
