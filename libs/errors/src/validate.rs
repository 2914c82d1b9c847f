//! Request validation shared by the services: each check names the field it
//! rejects, so REST answers 422 and gRPC `INVALID_ARGUMENT` pointing at it.

use std::ops::RangeInclusive;
use uuid::Uuid;

/// One rejected input field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidField {
    pub field: String,
    pub message: String,
}

impl InvalidField {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

impl From<InvalidField> for tonic::Status {
    fn from(e: InvalidField) -> Self {
        crate::status::invalid_argument(&e.field, e.message)
    }
}

pub type Valid<T> = Result<T, InvalidField>;

/// A UUID in its text form.
pub fn uuid(field: &str, value: &str) -> Valid<Uuid> {
    value.parse().map_err(|_| InvalidField::new(field, "must be a UUID"))
}

/// A UUID, or a fresh one when `value` is empty (client-chosen ids are optional).
pub fn uuid_or_new(field: &str, value: &str) -> Valid<Uuid> {
    if value.is_empty() { Ok(Uuid::new_v4()) } else { uuid(field, value) }
}

/// Text of at most `max` characters as sent, not blank, without NUL, trimmed (PostgreSQL text cannot hold it).
pub fn text(field: &str, value: &str, max: usize) -> Valid<String> {
    if value.contains('\0') {
        return Err(InvalidField::new(field, "must not contain NUL characters"));
    }
    let v = value.trim();
    // The length is the one a client's schema checks: of the value as sent.
    if v.is_empty() || value.chars().count() > max {
        return Err(InvalidField::new(field, format!("must be 1 to {max} characters")));
    }
    Ok(v.to_string())
}

/// An integer within `range`.
pub fn within(field: &str, value: i64, range: RangeInclusive<i64>) -> Valid<i64> {
    if !range.contains(&value) {
        return Err(InvalidField::new(
            field,
            format!("must be between {} and {}", range.start(), range.end()),
        ));
    }
    Ok(value)
}

/// Order lines: 1 to `max_items` of `(product_id, quantity)`, each quantity
/// in `1..=max_quantity`; lines for the same product are summed (and the sum
/// checked). The map's order is the product-id order, the order rows are
/// locked in.
pub fn order_lines<'a>(
    lines: impl ExactSizeIterator<Item = (&'a str, i64)>,
    max_items: usize,
    max_quantity: i64,
) -> Valid<std::collections::BTreeMap<Uuid, i64>> {
    if lines.len() == 0 || lines.len() > max_items {
        return Err(InvalidField::new("items", format!("must hold 1 to {max_items} items")));
    }
    let mut merged = std::collections::BTreeMap::new();
    for (i, (product_id, quantity)) in lines.enumerate() {
        let id = uuid(&format!("items[{i}].product_id"), product_id)?;
        let q = within(&format!("items[{i}].quantity"), quantity, 1..=max_quantity)?;
        let sum = merged.entry(id).or_insert(0);
        *sum = within(&format!("items[{i}].quantity"), *sum + q, 1..=max_quantity)?;
    }
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_names_its_field() {
        assert_eq!(uuid("order_id", "x").unwrap_err().field, "order_id");
        assert_eq!(text("name", "  ", 10).unwrap_err().field, "name");
        assert_eq!(text("name", " ab ", 10).unwrap(), "ab");
        assert!(text("name", "abcdef", 5).is_err());
        assert!(text("name", "\tabcde", 5).is_err(), "the limit counts what was sent, not what is kept");
        assert_eq!(text("sku", "a\0b", 10).unwrap_err().message, "must not contain NUL characters");
        assert_eq!(within("quantity", 0, 1..=5).unwrap_err().message, "must be between 1 and 5");
        assert_eq!(within("quantity", 5, 1..=5).unwrap(), 5);
        assert!(uuid_or_new("id", "").is_ok());
        let status: tonic::Status = InvalidField::new("items[0].quantity", "bad").into();
        assert_eq!(crate::status::invalid_field(&status), Some("items[0].quantity"));
    }

    #[test]
    fn order_lines_merge_duplicates_and_name_the_bad_line() {
        let p = "6b1c3b8e-3c59-4d4e-9a63-0d0f7f1b1a52";
        let lines = order_lines([(p, 2), (p, 3)].into_iter(), 10, 100).unwrap();
        assert_eq!(lines.values().copied().collect::<Vec<_>>(), vec![5]);
        assert_eq!(
            order_lines([(p, 1), (p, 0)].into_iter(), 10, 100).unwrap_err().field,
            "items[1].quantity"
        );
        assert_eq!(
            order_lines([(p, 60), (p, 60)].into_iter(), 10, 100).unwrap_err().field,
            "items[1].quantity"
        );
        assert_eq!(order_lines([("x", 1)].into_iter(), 10, 100).unwrap_err().field, "items[0].product_id");
        assert_eq!(order_lines(std::iter::empty(), 10, 100).unwrap_err().field, "items");
    }
}
