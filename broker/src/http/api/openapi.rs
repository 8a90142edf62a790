//! Completes the OpenAPI document that utoipa builds from the handlers' `#[utoipa::path]`
//! annotations, so that it is valid OpenAPI 3.1 and generated clients work: the errors every
//! route can meet from the layers around it, an `operationId` per operation that is unique and
//! readable, and a description on every response. All of it is derived from the document itself,
//! so a new route needs nothing here; `tests/api.rs` and `scripts/openapi-check.sh` check the
//! result (the latter with a real validator and a client generated from it).

use axum::http::StatusCode;
use utoipa::openapi::OpenApi;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

/// Everything below, in order: the common errors first, so that they get descriptions too.
pub(super) fn complete(doc: &mut OpenApi) {
    document_common_errors(doc);
    name_operations(doc);
    describe_responses(doc);
}

/// Calls `f(path, method, operation)` for every operation of the document, `method` lower case.
fn for_each_operation(doc: &mut OpenApi, mut f: impl FnMut(&str, &str, &mut Operation)) {
    for (path, item) in doc.paths.paths.iter_mut() {
        let operations = [
            ("get", &mut item.get),
            ("put", &mut item.put),
            ("post", &mut item.post),
            ("delete", &mut item.delete),
            ("options", &mut item.options),
            ("head", &mut item.head),
            ("patch", &mut item.patch),
            ("trace", &mut item.trace),
            ("query", &mut item.query),
        ];
        for (method, op) in operations {
            if let Some(op) = op {
                f(path, method, op);
            }
        }
        for (method, op) in item.additional_operations.iter_mut() {
            f(path, &method.to_ascii_lowercase(), op);
        }
    }
}

/// Gives every operation an `operationId` that names what it does to what, so that generated
/// clients get distinct, readable functions (utoipa's default is the bare handler name, and
/// `list` or `get` recur in several modules). The id is derived from the handler's name and the
/// path, so a new route needs nothing here (`tests/api.rs` checks that the ids stay unique):
///
/// - the resource is the path's first segment (`agent-tokens` → `agent_tokens`), plural for a
///   GET of the collection itself (no path parameter), singular otherwise (`jobs` → `job`,
///   `policies` → `policy`);
/// - a GET whose handler is named after the path's last segment reads that thing: `list_pools`
///   for `GET /pools`, `get_job_logs` for `GET /jobs/{id}/logs`;
/// - any other handler is a verb: its name followed by the resource, where the handler's name
///   does not already end with it (`submit_job`, `cancel_job`, `list_jobs`, `patch_pool`,
///   `list_agent_tokens`, `what_if_policy`).
fn name_operations(doc: &mut OpenApi) {
    for_each_operation(doc, |path, method, op| {
        let handler = op.operation_id.clone().unwrap_or_default();
        op.operation_id = Some(operation_id(method, path, &handler));
    });
}

fn operation_id(method: &str, path: &str, handler: &str) -> String {
    let snake = |s: &str| s.replace('-', "_").to_ascii_lowercase();
    let literals: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty() && !s.starts_with('{'))
        .map(snake)
        .collect();
    let has_param = path.contains('{');
    let Some(resource) = literals.first() else {
        return snake(handler);
    };
    let collection_get = method == "get" && !has_param;
    let noun = if collection_get {
        resource.clone()
    } else {
        singular(resource)
    };
    let handler = snake(handler);
    if method == "get" && literals.last() == Some(&handler) {
        return if collection_get {
            format!("list_{noun}")
        } else {
            format!("get_{noun}_{handler}")
        };
    }
    // The handler's name followed by the noun, sharing the words where the name's end is the
    // noun's start: `list_agent` + `agent_tokens` → `list_agent_tokens`.
    let verb: Vec<&str> = handler.split('_').filter(|w| !w.is_empty()).collect();
    let object: Vec<&str> = noun.split('_').collect();
    let overlap = (0..=verb.len().min(object.len()))
        .rev()
        .find(|&n| verb[verb.len() - n..] == object[..n])
        .unwrap_or(0);
    verb.iter()
        .chain(&object[overlap..])
        .copied()
        .collect::<Vec<_>>()
        .join("_")
}

/// The singular of a resource's name in this API (`policies`, `jobs`, `agent_tokens`, `audit`).
fn singular(plural: &str) -> String {
    if let Some(stem) = plural.strip_suffix("ies") {
        format!("{stem}y")
    } else if let Some(stem) = plural.strip_suffix('s').filter(|_| !plural.ends_with("ss")) {
        stem.to_string()
    } else {
        plural.to_string()
    }
}

/// OpenAPI requires a description on every response; a handler that documents a status without
/// one gets the meaning that status has across this API.
fn describe_responses(doc: &mut OpenApi) {
    for_each_operation(doc, |_, _, op| {
        for (status, response) in op.responses.responses.iter_mut() {
            if let RefOr::T(response) = response
                && response.description.trim().is_empty()
            {
                response.description = status_description(status);
            }
        }
    });
}

fn status_description(status: &str) -> String {
    let text = match status {
        "200" => "Success: the body is the result",
        "201" => "Created: the body is what was created",
        "202" => "Accepted: the body is the state now; the change may still be under way",
        "204" => "Done, with no body",
        "400" => {
            "Bad input: `error.field` names the field or parameter at fault, `error.message` says why"
        }
        "401" => "No token, or a token that is unknown or revoked",
        "403" => "Not allowed for this token's role or team",
        "404" => "Not found, or not visible to this token's team",
        "408" => "The body did not arrive in time",
        "409" => "Conflicts with the current state; `error.message` says how",
        "413" => "The body is over the size limit",
        "422" => "Refused by a rule: `error.code` names the rule, `error.field` the field at fault",
        "429" => "Too many requests with this credential (`Retry-After`)",
        "500" => "The broker failed (`error.code` `internal`); the details are in the broker's log",
        "503" => "Unavailable for now; retry later",
        other => {
            let reason = other
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .and_then(|c| c.canonical_reason());
            return match reason {
                Some(reason) => format!("{reason}: see `error.code` and `error.message`"),
                None => format!("Status {other}: see the body"),
            };
        }
    };
    text.to_string()
}

/// Documents the refusals that come from the layers every route sits behind rather than from
/// its handler, on every operation that can meet them (found by schemathesis): 401 where a
/// token is needed, 403 for a write made with a console session cookie without its CSRF token,
/// 429 from the per-credential rate limit, 400 for a bad query string, for a request body 400
/// (not JSON, or malformed), 408 (body too slow) and 413 (body too large), and 500 everywhere
/// (a database error). A handler's own description of a status is kept.
fn document_common_errors(doc: &mut OpenApi) {
    let error = |description: &str| {
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build()
    };
    for_each_operation(doc, |_, method, op| {
        let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
        let has_body = op.request_body.is_some();
        let has_query = op.parameters.iter().flatten().any(|p| {
            matches!(p, RefOr::T(p)
                if p.parameter_in == ParameterIn::Query)
        });
        let mut add = |status: &str, description: &str| {
            op.responses
                .responses
                .entry(status.to_string())
                .or_insert_with(|| error(description).into());
        };
        if secured {
            add("401", "No token, or a token that is unknown or revoked");
            add(
                "429",
                "Too many requests with this credential (`Retry-After`)",
            );
            if !matches!(method, "get" | "head" | "options") {
                add(
                    "403",
                    "Not allowed; or made with a console session cookie without its `X-CSRF-Token`",
                );
            }
        }
        if has_query {
            add("400", "A query parameter is unknown or invalid");
        }
        if has_body {
            add("400", "Malformed JSON, not JSON, or an invalid field");
            add("408", "The body did not arrive in time");
            add("413", "The body is over the size limit");
        }
        add(
            "500",
            "The broker failed (`error.code` `internal`); the details are in the broker's log",
        );
    });
}

#[cfg(test)]
mod tests {
    use super::{operation_id, singular};

    #[test]
    fn operation_ids_name_the_action_and_the_resource() {
        for (method, path, handler, id) in [
            ("get", "/jobs", "list", "list_jobs"),
            ("post", "/jobs", "submit", "submit_job"),
            ("get", "/jobs/{id}", "get", "get_job"),
            ("post", "/jobs/{id}/cancel", "cancel", "cancel_job"),
            ("get", "/jobs/{id}/logs", "logs", "get_job_logs"),
            ("get", "/pools", "pools", "list_pools"),
            ("patch", "/pools/{id}", "patch_pool", "patch_pool"),
            ("get", "/agent-tokens", "list_agent", "list_agent_tokens"),
            (
                "delete",
                "/agent-tokens/{node}",
                "revoke_agent",
                "revoke_agent_token",
            ),
            ("get", "/policies/{team}", "get", "get_policy"),
            (
                "post",
                "/policies/{team}/what-if",
                "what_if",
                "what_if_policy",
            ),
            ("get", "/audit", "list", "list_audit"),
            ("get", "/", "index", "index"),
        ] {
            assert_eq!(operation_id(method, path, handler), id, "{method} {path}");
        }
    }

    #[test]
    fn singulars() {
        assert_eq!(singular("policies"), "policy");
        assert_eq!(singular("agent_tokens"), "agent_token");
        assert_eq!(singular("audit"), "audit");
        assert_eq!(singular("access"), "access");
    }
}
