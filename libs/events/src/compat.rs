//! Backward compatibility of a change to a published event version.
//!
//! A version, once published, only changes in ways that every producer and
//! consumer of it survives, in either order of deployment:
//!
//! * no required field is removed, and none becomes optional (a consumer
//!   built with the old type needs it);
//! * no field changes type or format (either side fails to decode);
//! * a new field is optional (`Option<T>` or `#[serde(default)]`): events
//!   written before the change do not have it;
//! * an enumeration keeps every value it had.
//!
//! Removing an optional field is allowed (readers default it). Anything else
//! is a new version: see [`sagaworks_event::Event`].

use serde_json::Value;
use std::collections::BTreeSet;
use std::fmt;

/// One way a new schema breaks the old one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incompatibility {
    /// The field, as `a.b[].c` (empty for the payload itself).
    pub field: String,
    pub problem: String,
}

impl fmt::Display for Incompatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "the payload {}", self.problem)
        } else {
            write!(f, "field `{}` {}", self.field, self.problem)
        }
    }
}

/// How `new` breaks `old` (both JSON Schemas without `$ref`s, as
/// [`crate::catalog::schema_of`] makes them); empty when it does not.
pub fn check(old: &Value, new: &Value) -> Vec<Incompatibility> {
    let mut out = Vec::new();
    compare(old, new, "", &mut out);
    out
}

fn compare(old: &Value, new: &Value, path: &str, out: &mut Vec<Incompatibility>) {
    let mut problem = |problem: String| out.push(Incompatibility { field: path.to_string(), problem });
    let (old_types, new_types) = (types(old), types(new));
    if old_types != new_types {
        problem(format!("changed type from {} to {}", show(&old_types), show(&new_types)));
        return;
    }
    if old.get("format") != new.get("format") {
        problem(format!(
            "changed format from {} to {}",
            show_opt(old.get("format")),
            show_opt(new.get("format"))
        ));
    }
    if let Some(old_values) = old.get("enum").and_then(Value::as_array) {
        let new_values = new.get("enum").and_then(Value::as_array);
        for v in old_values {
            if !new_values.is_some_and(|n| n.contains(v)) {
                problem(format!("no longer allows the value {v}"));
            }
        }
    }
    if old.get("const") != new.get("const") {
        problem(format!(
            "changed its constant from {} to {}",
            show_opt(old.get("const")),
            show_opt(new.get("const"))
        ));
    }
    for key in ["anyOf", "oneOf"] {
        match (old.get(key).and_then(Value::as_array), new.get(key).and_then(Value::as_array)) {
            (None, None) => {}
            (Some(o), Some(n)) if o.len() == n.len() => {
                for (i, (o, n)) in o.iter().zip(n).enumerate() {
                    compare(o, n, &format!("{path}<{key}[{i}]>"), out);
                }
            }
            _ => out.push(Incompatibility {
                field: path.to_string(),
                problem: format!("changed its {key} alternatives"),
            }),
        }
    }
    if let (Some(o), Some(n)) = (old.get("items"), new.get("items")) {
        compare(o, n, &format!("{path}[]"), out);
    }
    compare_properties(old, new, path, out);
}

fn compare_properties(old: &Value, new: &Value, path: &str, out: &mut Vec<Incompatibility>) {
    let empty = serde_json::Map::new();
    let old_props = old.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let new_props = new.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let (old_required, new_required) = (required(old), required(new));
    let field = |name: &str| if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
    for (name, old_prop) in old_props {
        let was_required = old_required.contains(name.as_str());
        match new_props.get(name) {
            None if was_required => out.push(Incompatibility {
                field: field(name),
                problem: "was removed, but it is required: consumers built with the old type need it".into(),
            }),
            None => {}
            Some(new_prop) => {
                if was_required && !new_required.contains(name.as_str()) {
                    out.push(Incompatibility {
                        field: field(name),
                        problem: "is no longer required: consumers built with the old type need it".into(),
                    });
                }
                compare(old_prop, new_prop, &field(name), out);
            }
        }
    }
    for name in new_props.keys().filter(|n| new_required.contains(n.as_str())) {
        if !old_props.contains_key(name) {
            out.push(Incompatibility {
                field: field(name),
                problem: "is new and required: events written before it lack it (make it an Option or \
                          #[serde(default)])"
                    .into(),
            });
        } else if !old_required.contains(name.as_str()) {
            out.push(Incompatibility {
                field: field(name),
                problem: "became required: events written before may lack it".into(),
            });
        }
    }
}

fn types(schema: &Value) -> BTreeSet<String> {
    match schema.get("type") {
        Some(Value::String(t)) => BTreeSet::from([t.clone()]),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        _ => BTreeSet::new(),
    }
}

fn required(schema: &Value) -> BTreeSet<&str> {
    schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect()
}

fn show(types: &BTreeSet<String>) -> String {
    if types.is_empty() { "any".into() } else { types.iter().cloned().collect::<Vec<_>>().join(" or ") }
}

fn show_opt(v: Option<&Value>) -> String {
    v.map_or_else(|| "none".into(), Value::to_string)
}

#[cfg(test)]
mod tests {
    //! Scratch payload types, each a deliberate change to `Before`, show what
    //! the rules catch and what they let through.

    use super::*;
    use crate::catalog::schema_of;
    use schemars::JsonSchema;

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Line {
        product_id: uuid::Uuid,
        quantity: i64,
    }

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Before {
        order_id: uuid::Uuid,
        total_cents: i64,
        note: Option<String>,
        lines: Vec<Line>,
    }

    fn problems<T: JsonSchema>() -> Vec<String> {
        check(&schema_of::<Before>(), &schema_of::<T>()).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_same_schema_is_compatible() {
        assert_eq!(problems::<Before>(), Vec::<String>::new());
    }

    #[test]
    fn a_new_optional_field_and_a_removed_optional_one_are_compatible() {
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        struct After {
            order_id: uuid::Uuid,
            total_cents: i64,
            lines: Vec<Line>,
            currency: Option<String>,
            #[serde(default)]
            gift: bool,
        }
        assert_eq!(problems::<After>(), Vec::<String>::new());
    }

    #[test]
    fn a_removed_required_field_is_named() {
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        struct After {
            order_id: uuid::Uuid,
            note: Option<String>,
            lines: Vec<Line>,
        }
        assert_eq!(
            problems::<After>(),
            [
                "field `total_cents` was removed, but it is required: consumers built with the old type need it"
            ]
        );
    }

    #[test]
    fn a_renamed_field_is_a_removal_and_a_new_required_field() {
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        struct After {
            order_id: uuid::Uuid,
            amount_cents: i64,
            note: Option<String>,
            lines: Vec<Line>,
        }
        let problems = problems::<After>();
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("field `total_cents` was removed"), "{problems:?}");
        assert!(problems[1].starts_with("field `amount_cents` is new and required"), "{problems:?}");
    }

    #[test]
    fn a_type_change_deep_in_an_array_is_named_with_its_path() {
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        struct TextLine {
            product_id: uuid::Uuid,
            quantity: String,
        }
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        struct After {
            order_id: uuid::Uuid,
            total_cents: i64,
            note: Option<String>,
            lines: Vec<TextLine>,
        }
        assert_eq!(problems::<After>(), ["field `lines[].quantity` changed type from integer to string"]);
    }

    #[test]
    fn a_format_change_and_an_optional_required_field_are_named() {
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        struct After {
            order_id: String,
            total_cents: Option<i64>,
            note: String,
            lines: Vec<Line>,
        }
        assert_eq!(
            problems::<After>(),
            [
                "field `note` changed type from null or string to string",
                "field `order_id` changed format from \"uuid\" to none",
                "field `total_cents` is no longer required: consumers built with the old type need it",
                "field `total_cents` changed type from integer to integer or null",
                "field `note` became required: events written before may lack it",
            ]
        );
    }

    #[test]
    fn a_removed_enum_value_is_named() {
        let old = serde_json::json!({"type": "object", "required": ["state"],
            "properties": {"state": {"type": "string", "enum": ["open", "closed"]}}});
        let new = serde_json::json!({"type": "object", "required": ["state"],
            "properties": {"state": {"type": "string", "enum": ["open", "archived"]}}});
        let problems: Vec<String> = check(&old, &new).iter().map(ToString::to_string).collect();
        assert_eq!(problems, ["field `state` no longer allows the value \"closed\""]);
    }
}
