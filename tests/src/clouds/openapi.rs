//! A small validator of JSON values against the schemas of a published API description
//! (Swagger 2 or OpenAPI 3.0/3.1), for the fake clouds: they check every request they receive
//! against the description checked in under `tests/data/apis/`.
//!
//! What it checks: `$ref` (any JSON pointer inside the same document: `#/definitions/…`,
//! `#/components/schemas/…`, `#/parameters/…`), `type` (one name, or a list as OpenAPI 3.1
//! writes it, `"null"` included), `nullable` / `x-nullable`, `const`, `enum` (open when Azure's
//! `x-ms-enum.modelAsString` says so), `properties`, `required`, `additionalProperties` (`false`
//! or a schema; the properties of `allOf` members count as declared), `items`,
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `minimum`/`maximum`, `allOf`, and
//! `oneOf`/`anyOf` (at least one alternative matches). `readOnly` properties are refused in a
//! request and `writeOnly` ones in a response; neither is required on the side that may not
//! send it. `format` and `pattern` are not checked (no regex engine in this crate), nor
//! discriminators. Every error names the JSON path of the value it is about (`$.a.b[2]`).
//!
//! [`Spec::operation`] finds the operation for a method and a concrete request path among the
//! description's path templates (`/api/v1/instances/{id}`), with its request-body schema and
//! the query parameters it allows.

use anyhow::Context as _;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Which way a value travels: `readOnly` properties may not be sent in a request,
/// `writeOnly` ones never come back in a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Request,
    Response,
}

/// A loaded API description.
#[derive(Clone, Debug)]
pub struct Spec {
    doc: Value,
}

/// One query parameter an operation declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryParam {
    pub name: String,
    pub required: bool,
}

/// The operation a request path matched.
#[derive(Clone, Debug)]
pub struct Operation<'a> {
    /// The path template as the description writes it.
    pub template: String,
    /// The values of the template's `{name}` segments in the concrete path.
    pub path_params: BTreeMap<String, String>,
    /// The JSON request body's schema, if the operation takes one.
    pub body_schema: Option<&'a Value>,
    /// Whether the body must be present.
    pub body_required: bool,
    /// The query parameters the operation declares.
    pub query: Vec<QueryParam>,
    /// The operation object itself.
    pub raw: &'a Value,
}

impl Operation<'_> {
    /// Checks the query parameter names a request sent: every one declared, every required one
    /// present.
    pub fn check_query<'n>(
        &self,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Result<(), Vec<String>> {
        let sent: BTreeSet<&str> = names.into_iter().collect();
        let mut errors = Vec::new();
        for name in &sent {
            if !self.query.iter().any(|q| q.name == *name) {
                errors.push(format!(
                    "query parameter {name:?} is not declared for {}",
                    self.template
                ));
            }
        }
        for q in self.query.iter().filter(|q| q.required) {
            if !sent.contains(q.name.as_str()) {
                errors.push(format!("required query parameter {:?} is missing", q.name));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

impl Spec {
    /// Reads a JSON description from a file.
    pub fn load(path: &Path) -> anyhow::Result<Spec> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let doc: Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        Ok(Spec::from_value(doc))
    }

    pub fn from_value(doc: Value) -> Spec {
        Spec { doc }
    }

    /// The whole document.
    pub fn document(&self) -> &Value {
        &self.doc
    }

    /// A named schema: `#/definitions/{name}` (Swagger 2) or `#/components/schemas/{name}`.
    pub fn schema(&self, name: &str) -> Option<&Value> {
        self.doc
            .pointer(&format!("/definitions/{}", escape(name)))
            .or_else(|| {
                self.doc
                    .pointer(&format!("/components/schemas/{}", escape(name)))
            })
    }

    /// Resolves a local reference (`#/…`).
    pub fn resolve(&self, reference: &str) -> Result<&Value, String> {
        let pointer = reference
            .strip_prefix('#')
            .ok_or_else(|| format!("$ref {reference:?} points outside this document"))?;
        self.doc
            .pointer(pointer)
            .ok_or_else(|| format!("$ref {reference:?} does not resolve"))
    }

    /// Follows `$ref`s until an object without one (bounded, so a cycle cannot hang).
    fn deref<'a>(&'a self, mut v: &'a Value) -> Result<&'a Value, String> {
        for _ in 0..32 {
            match v.get("$ref").and_then(Value::as_str) {
                Some(r) => v = self.resolve(r)?,
                None => return Ok(v),
            }
        }
        Err("$ref chain too long".into())
    }

    /// Validates `value` against `schema` (a schema object of this document); the errors name
    /// JSON paths from `$`.
    pub fn validate(
        &self,
        schema: &Value,
        value: &Value,
        direction: Direction,
    ) -> Result<(), Vec<String>> {
        let mut errors = Vec::new();
        self.check(schema, value, direction, "$", &mut errors, 0);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// Validates against a named schema ([`Spec::schema`]).
    pub fn validate_named(
        &self,
        name: &str,
        value: &Value,
        direction: Direction,
    ) -> Result<(), Vec<String>> {
        let schema = self
            .schema(name)
            .ok_or_else(|| vec![format!("no schema named {name:?} in the description")])?;
        self.validate(schema, value, direction)
    }

    fn check(
        &self,
        schema: &Value,
        value: &Value,
        dir: Direction,
        path: &str,
        errors: &mut Vec<String>,
        depth: u32,
    ) {
        if depth > 64 {
            errors.push(format!("{path}: schema nesting too deep"));
            return;
        }
        let Some(obj) = schema.as_object() else {
            // `true` accepts anything, `false` nothing (JSON Schema booleans).
            if schema == &Value::Bool(false) {
                errors.push(format!("{path}: no value is allowed here"));
            }
            return;
        };
        if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
            match self.resolve(r) {
                Ok(target) => self.check(target, value, dir, path, errors, depth + 1),
                Err(e) => errors.push(format!("{path}: {e}")),
            }
        }
        if value.is_null() && self.allows_null(obj) {
            return;
        }
        if let Some(types) = obj.get("type") {
            let names: Vec<&str> = match types {
                Value::String(s) => vec![s.as_str()],
                Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !names.is_empty() && !names.iter().any(|t| type_matches(t, value)) {
                errors.push(format!(
                    "{path}: expected {}, got {}",
                    names.join(" or "),
                    kind(value)
                ));
                return;
            }
        }
        if let Some(c) = obj.get("const")
            && c != value
        {
            errors.push(format!("{path}: expected the constant {c}, got {value}"));
        }
        if let Some(Value::Array(allowed)) = obj.get("enum") {
            let open = obj
                .get("x-ms-enum")
                .and_then(|e| e.get("modelAsString"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if !open && !allowed.contains(value) {
                errors.push(format!(
                    "{path}: {value} is not one of {}",
                    Value::Array(allowed.clone())
                ));
            }
        }
        match value {
            Value::String(s) => {
                let n = s.chars().count() as u64;
                if let Some(min) = obj.get("minLength").and_then(Value::as_u64)
                    && n < min
                {
                    errors.push(format!("{path}: shorter than {min} characters"));
                }
                if let Some(max) = obj.get("maxLength").and_then(Value::as_u64)
                    && n > max
                {
                    errors.push(format!("{path}: longer than {max} characters ({n})"));
                }
            }
            Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    if let Some(min) = obj.get("minimum").and_then(Value::as_f64)
                        && x < min
                    {
                        errors.push(format!("{path}: {x} is below the minimum {min}"));
                    }
                    if let Some(max) = obj.get("maximum").and_then(Value::as_f64)
                        && x > max
                    {
                        errors.push(format!("{path}: {x} is above the maximum {max}"));
                    }
                }
            }
            Value::Array(items) => {
                let n = items.len() as u64;
                if let Some(min) = obj.get("minItems").and_then(Value::as_u64)
                    && n < min
                {
                    errors.push(format!("{path}: fewer than {min} items"));
                }
                if let Some(max) = obj.get("maxItems").and_then(Value::as_u64)
                    && n > max
                {
                    errors.push(format!("{path}: more than {max} items"));
                }
                if let Some(item_schema) = obj.get("items") {
                    for (i, item) in items.iter().enumerate() {
                        self.check(
                            item_schema,
                            item,
                            dir,
                            &format!("{path}[{i}]"),
                            errors,
                            depth + 1,
                        );
                    }
                }
            }
            Value::Object(fields) => self.check_object(obj, fields, dir, path, errors, depth),
            _ => {}
        }
        if let Some(Value::Array(all)) = obj.get("allOf") {
            for s in all {
                // The members' own additionalProperties would refuse the other members'
                // properties; the declared set is checked here, on the whole.
                self.check_member(s, value, dir, path, errors, depth + 1);
            }
        }
        for key in ["oneOf", "anyOf"] {
            if let Some(Value::Array(alternatives)) = obj.get(key) {
                let mut why = Vec::new();
                let matched = alternatives.iter().any(|s| {
                    let mut e = Vec::new();
                    self.check(s, value, dir, path, &mut e, depth + 1);
                    if let Some(first) = e.into_iter().next() {
                        why.push(first);
                        false
                    } else {
                        true
                    }
                });
                if !matched {
                    errors.push(format!(
                        "{path}: matches none of the {} {key} alternatives ({})",
                        alternatives.len(),
                        why.join("; ")
                    ));
                }
            }
        }
    }

    /// An `allOf` member: checked without its `additionalProperties: false` (the whole's
    /// declared properties are checked by the parent).
    fn check_member(
        &self,
        schema: &Value,
        value: &Value,
        dir: Direction,
        path: &str,
        errors: &mut Vec<String>,
        depth: u32,
    ) {
        match self.deref(schema) {
            Ok(target) => match target.as_object() {
                Some(o) if o.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    let mut relaxed = o.clone();
                    relaxed.remove("additionalProperties");
                    self.check(&Value::Object(relaxed), value, dir, path, errors, depth);
                }
                _ => self.check(target, value, dir, path, errors, depth),
            },
            Err(e) => errors.push(format!("{path}: {e}")),
        }
    }

    fn check_object(
        &self,
        obj: &Map<String, Value>,
        fields: &Map<String, Value>,
        dir: Direction,
        path: &str,
        errors: &mut Vec<String>,
        depth: u32,
    ) {
        let props = obj.get("properties").and_then(Value::as_object);
        if let Some(Value::Array(required)) = obj.get("required") {
            for name in required.iter().filter_map(Value::as_str) {
                if fields.contains_key(name) {
                    continue;
                }
                let prop = props
                    .and_then(|p| p.get(name))
                    .and_then(|p| self.deref(p).ok());
                let exempt = prop.is_some_and(|p| match dir {
                    Direction::Request => flag(p, "readOnly"),
                    Direction::Response => flag(p, "writeOnly"),
                });
                if !exempt {
                    errors.push(format!("{path}: required property {name:?} is missing"));
                }
            }
        }
        let declared = self.declared_properties(obj, 0);
        for (name, v) in fields {
            let child = format!("{path}.{name}");
            if let Some(p) = props.and_then(|p| p.get(name)) {
                let resolved = self.deref(p).unwrap_or(p);
                if dir == Direction::Request && (flag(p, "readOnly") || flag(resolved, "readOnly"))
                {
                    errors.push(format!("{child}: read-only, may not be sent in a request"));
                    continue;
                }
                if dir == Direction::Response
                    && (flag(p, "writeOnly") || flag(resolved, "writeOnly"))
                {
                    errors.push(format!(
                        "{child}: write-only, may not come back in a response"
                    ));
                    continue;
                }
                self.check(p, v, dir, &child, errors, depth + 1);
            } else if declared.contains(name.as_str()) {
                // Declared by an allOf member, which checks it.
            } else {
                match obj.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        errors.push(format!(
                            "{child}: unknown property (the schema allows no others)"
                        ));
                    }
                    Some(s @ Value::Object(_)) => self.check(s, v, dir, &child, errors, depth + 1),
                    _ => {}
                }
            }
        }
    }

    /// The property names a schema declares, its `allOf` members' included.
    fn declared_properties<'a>(
        &'a self,
        obj: &'a Map<String, Value>,
        depth: u32,
    ) -> BTreeSet<&'a str> {
        let mut names: BTreeSet<&str> = obj
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        if depth < 16
            && let Some(Value::Array(all)) = obj.get("allOf")
        {
            for member in all {
                if let Ok(Value::Object(m)) = self.deref(member) {
                    names.extend(self.declared_properties(m, depth + 1));
                }
            }
        }
        names
    }

    fn allows_null(&self, obj: &Map<String, Value>) -> bool {
        flag_map(obj, "nullable")
            || flag_map(obj, "x-nullable")
            || matches!(obj.get("type"), Some(Value::Array(a)) if a.iter().any(|t| t == "null"))
            || matches!(obj.get("enum"), Some(Value::Array(a)) if a.contains(&Value::Null))
            || ["anyOf", "oneOf"].iter().any(|k| {
                matches!(obj.get(*k), Some(Value::Array(a)) if a.iter().any(|s| {
                    self.deref(s).ok().and_then(Value::as_object).is_some_and(|o| {
                        o.get("type") == Some(&Value::String("null".into()))
                    })
                }))
            })
    }

    /// The operation for `method` (any case) and a concrete request `path` (no query string).
    /// A Swagger 2 `basePath` is stripped first. Where several templates match, the one with
    /// the most literal segments wins (`/instances/launch` over `/instances/{id}`).
    pub fn operation(&self, method: &str, path: &str) -> Option<Operation<'_>> {
        let method = method.to_ascii_lowercase();
        let paths = self.doc.get("paths")?.as_object()?;
        let path = match self.doc.get("basePath").and_then(Value::as_str) {
            Some(base) if base != "/" => path.strip_prefix(base.trim_end_matches('/'))?,
            _ => path,
        };
        let concrete: Vec<&str> = path.trim_end_matches('/').split('/').collect();
        let mut best: Option<(usize, &str, &Value, BTreeMap<String, String>)> = None;
        for (template, item) in paths {
            let segments: Vec<&str> = template.trim_end_matches('/').split('/').collect();
            if segments.len() != concrete.len() {
                continue;
            }
            let Some(op) = item.get(&method) else {
                continue;
            };
            let mut params = BTreeMap::new();
            let mut literals = 0;
            let mut ok = true;
            for (t, c) in segments.iter().zip(&concrete) {
                if let Some(name) = t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                    if c.is_empty() {
                        ok = false;
                        break;
                    }
                    params.insert(name.to_string(), (*c).to_string());
                } else if t == c {
                    literals += 1;
                } else {
                    ok = false;
                    break;
                }
            }
            if ok && best.as_ref().is_none_or(|(l, ..)| literals > *l) {
                best = Some((literals, template.as_str(), op, params));
            }
        }
        let (_, template, op, path_params) = best?;
        let item = paths.get(template)?;
        let mut query = Vec::new();
        let mut body_schema = None;
        let mut body_required = false;
        let declared = item
            .get("parameters")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .chain(
                op.get("parameters")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten(),
            );
        for p in declared {
            let Ok(p) = self.deref(p) else { continue };
            let required = flag(p, "required");
            match p.get("in").and_then(Value::as_str) {
                Some("query") => {
                    if let Some(name) = p.get("name").and_then(Value::as_str) {
                        query.retain(|q: &QueryParam| q.name != name);
                        query.push(QueryParam {
                            name: name.to_string(),
                            required,
                        });
                    }
                }
                Some("body") => {
                    body_schema = p.get("schema");
                    body_required = required;
                }
                _ => {}
            }
        }
        if let Some(rb) = op.get("requestBody").and_then(|rb| self.deref(rb).ok()) {
            body_required = flag(rb, "required");
            body_schema = rb.get("content").and_then(Value::as_object).and_then(|c| {
                c.get("application/json")
                    .or_else(|| c.iter().find(|(k, _)| k.contains("json")).map(|(_, v)| v))
                    .and_then(|m| m.get("schema"))
            });
        }
        Some(Operation {
            template: template.to_string(),
            path_params,
            body_schema,
            body_required,
            query,
            raw: op,
        })
    }

    /// Validates one request: the operation exists, its query names are declared, and its
    /// JSON body (if any) validates. Returns the matched operation's template.
    pub fn check_request(
        &self,
        method: &str,
        path: &str,
        query_names: &[&str],
        body: Option<&Value>,
    ) -> Result<String, Vec<String>> {
        let op = self.operation(method, path).ok_or_else(|| {
            vec![format!(
                "{} {path}: no such operation in the description",
                method.to_uppercase()
            )]
        })?;
        let mut errors = Vec::new();
        if let Err(e) = op.check_query(query_names.iter().copied()) {
            errors.extend(e);
        }
        match (op.body_schema, body) {
            (Some(schema), Some(b)) => {
                if let Err(e) = self.validate(schema, b, Direction::Request) {
                    errors.extend(e);
                }
            }
            (Some(_), None) if op.body_required => {
                errors.push("the request body is missing".into())
            }
            (None, Some(_)) => errors.push(format!("{} takes no body", op.template)),
            _ => {}
        }
        if errors.is_empty() {
            Ok(op.template)
        } else {
            Err(errors)
        }
    }
}

fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn flag(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn flag_map(m: &Map<String, Value>, key: &str) -> bool {
    m.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        // "file" (Swagger 2 uploads) and unknown names are not checked.
        _ => true,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn swagger() -> Spec {
        Spec::from_value(json!({
            "swagger": "2.0",
            "basePath": "/base",
            "paths": {
                "/things/{id}": {
                    "parameters": [{"name": "id", "in": "path", "required": true, "type": "string"}],
                    "put": {
                        "parameters": [
                            {"$ref": "#/parameters/ApiVersion"},
                            {"name": "body", "in": "body", "required": true, "schema": {"$ref": "#/definitions/Thing"}}
                        ]
                    },
                    "get": {}
                },
                "/things/special": {"get": {"parameters": [{"name": "filter", "in": "query", "type": "string"}]}}
            },
            "parameters": {"ApiVersion": {"name": "api-version", "in": "query", "required": true, "type": "string"}},
            "definitions": {
                "Resource": {"properties": {"id": {"type": "string", "readOnly": true}, "location": {"type": "string"}}},
                "Thing": {
                    "allOf": [{"$ref": "#/definitions/Resource"}],
                    "properties": {
                        "size": {"type": "integer"},
                        "kind": {"type": "string", "enum": ["a", "b"]},
                        "open": {"type": "string", "enum": ["x"], "x-ms-enum": {"modelAsString": true}},
                        "note": {"type": "string", "x-nullable": true},
                        "tags": {"type": "object", "additionalProperties": {"type": "string"}},
                        "parts": {"type": "array", "items": {"$ref": "#/definitions/Part"}}
                    },
                    "required": ["size"],
                    "additionalProperties": false
                },
                "Part": {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"], "additionalProperties": false}
            }
        }))
    }

    fn openapi3() -> Spec {
        Spec::from_value(json!({
            "openapi": "3.1.0",
            "paths": {
                "/api/v1/instances": {"get": {"parameters": [{"name": "cluster_id", "in": "query", "required": false}]}},
                "/api/v1/instances/{id}": {"get": {}},
                "/api/v1/launch": {"post": {"requestBody": {"required": true, "content": {"application/json": {"schema": {
                    "type": "object",
                    "required": ["region", "keys"],
                    "properties": {
                        "region": {"type": "string"},
                        "keys": {"type": "array", "items": {"type": "string"}, "maxItems": 1},
                        "name": {"type": "string", "maxLength": 4},
                        "secret": {"type": "string", "writeOnly": true},
                        "maybe": {"type": ["string", "null"]},
                        "image": {"anyOf": [{"$ref": "#/components/schemas/ById"}, {"$ref": "#/components/schemas/ByFamily"}]}
                    }
                }}}}}}
            },
            "components": {"schemas": {
                "ById": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"], "additionalProperties": false},
                "ByFamily": {"type": "object", "properties": {"family": {"type": "string"}}, "required": ["family"], "additionalProperties": false},
                "Code": {"properties": {"code": {"const": "x/y", "type": "string"}}},
                "Nullable": {"type": "string", "nullable": true}
            }}
        }))
    }

    #[test]
    fn finds_operations_by_template_and_prefers_literal_segments() {
        let s = openapi3();
        let op = s
            .operation("GET", "/api/v1/instances/abc123")
            .expect("operation");
        assert_eq!(op.template, "/api/v1/instances/{id}");
        assert_eq!(op.path_params.get("id").map(String::as_str), Some("abc123"));
        assert!(s.operation("DELETE", "/api/v1/instances/abc123").is_none());
        assert!(s.operation("GET", "/api/v1/instances/a/b").is_none());
        assert!(
            s.operation("GET", "/api/v1/instances/")
                .is_some_and(|o| o.template == "/api/v1/instances")
        );

        let sw = swagger();
        assert_eq!(
            sw.operation("get", "/base/things/special")
                .expect("op")
                .template,
            "/things/special"
        );
        assert_eq!(
            sw.operation("get", "/base/things/7").expect("op").template,
            "/things/{id}"
        );
        assert!(
            sw.operation("get", "/things/7").is_none(),
            "basePath is required"
        );
    }

    #[test]
    fn query_parameters_are_declared_and_required_ones_present() {
        let sw = swagger();
        let op = sw.operation("PUT", "/base/things/7").expect("op");
        assert_eq!(
            op.query,
            vec![QueryParam {
                name: "api-version".into(),
                required: true
            }]
        );
        assert!(op.check_query(["api-version"]).is_ok());
        let e = op
            .check_query(["bogus"])
            .expect_err("undeclared and missing");
        assert_eq!(e.len(), 2, "{e:?}");
        let s = openapi3();
        let op = s.operation("GET", "/api/v1/instances").expect("op");
        assert!(op.check_query([]).is_ok());
        assert!(op.check_query(["cluster_id"]).is_ok());
    }

    #[test]
    fn swagger_bodies_validate_with_all_of_read_only_and_closed_objects() {
        let sw = swagger();
        let ok = json!({"size": 3, "location": "west", "kind": "a", "open": "anything", "note": null,
                        "tags": {"k": "v"}, "parts": [{"n": 1.5}]});
        assert_eq!(
            sw.check_request("PUT", "/base/things/7", &["api-version"], Some(&ok)),
            Ok("/things/{id}".into())
        );

        let bad = json!({"id": "x", "kind": "c", "tags": {"k": 1}, "parts": [{"n": "1"}, {}], "extra": true, "size": "3"});
        let errors = sw
            .check_request("PUT", "/base/things/7", &["api-version"], Some(&bad))
            .expect_err("invalid");
        let all = errors.join("\n");
        for expected in [
            "$.id: read-only",
            "$.kind: \"c\" is not one of",
            "$.tags.k: expected string, got a number",
            "$.parts[0].n: expected number, got a string",
            "$.parts[1]: required property \"n\" is missing",
            "$.extra: unknown property",
            "$.size: expected integer, got a string",
        ] {
            assert!(all.contains(expected), "{expected:?} not in\n{all}");
        }
        let missing = sw
            .check_request("PUT", "/base/things/7", &["api-version"], None)
            .expect_err("no body");
        assert_eq!(missing, vec!["the request body is missing".to_string()]);
        let no_size = sw
            .check_request("PUT", "/base/things/7", &["api-version"], Some(&json!({})))
            .expect_err("size");
        assert_eq!(
            no_size,
            vec!["$: required property \"size\" is missing".to_string()]
        );
    }

    #[test]
    fn openapi3_bodies_validate_with_any_of_lengths_nulls_and_write_only() {
        let s = openapi3();
        let ok = json!({"region": "r", "keys": ["k"], "name": "abcd", "secret": "s", "maybe": null, "image": {"family": "f"}});
        assert!(
            s.check_request("POST", "/api/v1/launch", &[], Some(&ok))
                .is_ok()
        );

        let bad = json!({"region": 1, "keys": ["a", "b"], "name": "abcde", "image": {"id": "i", "family": "f"}});
        let all = s
            .check_request("POST", "/api/v1/launch", &[], Some(&bad))
            .expect_err("bad")
            .join("\n");
        for expected in [
            "$.region: expected string, got a number",
            "$.keys: more than 1 items",
            "$.name: longer than 4 characters",
            "$.image: matches none of the 2 anyOf alternatives",
        ] {
            assert!(all.contains(expected), "{expected:?} not in\n{all}");
        }
        // A write-only property may be sent, never returned.
        let schema = s
            .operation("POST", "/api/v1/launch")
            .expect("op")
            .body_schema
            .expect("schema")
            .clone();
        let e = s
            .validate(&schema, &ok, Direction::Response)
            .expect_err("write-only");
        assert!(
            e.iter().any(|e| e.starts_with("$.secret: write-only")),
            "{e:?}"
        );
        assert!(
            s.check_request("GET", "/api/v1/instances/x", &[], Some(&json!({})))
                .is_err()
        );
        assert!(
            s.check_request("POST", "/api/v1/nowhere", &[], None)
                .is_err()
        );
    }

    #[test]
    fn named_schemas_const_and_nullable() {
        let s = openapi3();
        assert!(
            s.validate_named("Code", &json!({"code": "x/y"}), Direction::Response)
                .is_ok()
        );
        let e = s
            .validate_named("Code", &json!({"code": "x/z"}), Direction::Response)
            .expect_err("const");
        assert!(e[0].starts_with("$.code: expected the constant"), "{e:?}");
        assert!(
            s.validate_named("Nullable", &Value::Null, Direction::Request)
                .is_ok()
        );
        assert!(
            s.validate_named("Nullable", &json!(1), Direction::Request)
                .is_err()
        );
        assert!(
            s.validate_named("Missing", &json!(1), Direction::Request)
                .is_err()
        );
        let dangling = json!({"$ref": "#/components/schemas/Nope"});
        let e = s
            .validate(&dangling, &json!(1), Direction::Request)
            .expect_err("dangling");
        assert!(e[0].contains("does not resolve"), "{e:?}");
    }
}
