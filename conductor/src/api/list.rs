//! What the collection lists (`GET /v1/nodes`, `/v1/ports`, `/v1/nodes/{node}/ports`) share:
//! pagination and sorting (`limit`, `marker`, `sort_key`, `sort_dir`) and the list document with
//! its `next` link.

use std::collections::HashMap;

use axum::Json;
use serde_json::{json, Value};
use uuid::Uuid;

use super::body::{self, cut};
use super::error::ApiError;
use super::render::{self, Select};
use super::version::Ctx;

/// `?detail=` (1.43): whether a list shows every field; absent is the short set.
pub(super) fn detail(query: &HashMap<String, String>, ctx: &Ctx) -> Result<bool, ApiError> {
    match query.get("detail") {
        None => Ok(false),
        Some(v) => {
            ctx.require(43, "The \"detail\" parameter")?;
            body::parse_bool(v).ok_or_else(|| {
                ApiError::bad_request("Invalid value for parameter \"detail\": expected a boolean.")
            })
        }
    }
}

/// `?fields=` among `names` (the fields of this version); `default` when absent.
pub(super) fn fields(
    query: &HashMap<String, String>,
    default: Select,
    ctx: &Ctx,
    names: &[&str],
) -> Result<Select, ApiError> {
    Select::parse(query.get("fields").map(String::as_str), default, ctx, names)
}

/// Where a list document goes: its collection key and the path its `next` link repeats.
pub(super) struct Listing<'a> {
    /// The document's one key (`nodes`, `ports`).
    pub collection: &'a str,
    /// The path below `/v1/` the `next` link points at.
    pub path: &'a str,
    /// The request's microversion context.
    pub ctx: &'a Ctx,
}

/// Pagination and sorting of a list query.
pub(super) struct Page {
    /// At most this many.
    pub limit: Option<usize>,
    /// Start after this record.
    pub marker: Option<Uuid>,
    /// Field to sort on.
    pub sort_key: String,
    /// Descending.
    pub descending: bool,
}

impl Page {
    /// From `limit`, `marker`, `sort_key`, `sort_dir`; `sortable` lists the keys allowed.
    pub fn parse(query: &HashMap<String, String>, sortable: &[&str]) -> Result<Page, ApiError> {
        let limit = match query.get("limit") {
            None => None,
            Some(v) => Some(v.parse::<usize>().map_err(|_| {
                ApiError::bad_request(format!(
                    "Invalid value for parameter \"limit\": {:?} (expected a non-negative integer).",
                    cut(v)
                ))
            })?),
        }
        // Ironic: 0 means no limit.
        .filter(|l| *l > 0);
        let marker = match query.get("marker") {
            None => None,
            Some(v) => Some(body::parse_uuid(v, "marker")?),
        };
        let sort_key = query
            .get("sort_key")
            .cloned()
            .unwrap_or_else(|| "id".to_string());
        if !sortable.contains(&sort_key.as_str()) {
            return Err(ApiError::bad_request(format!(
                "The sort_key value {:?} is an invalid field for sorting (use one of: {}).",
                cut(&sort_key),
                sortable.join(", ")
            )));
        }
        let descending = match query.get("sort_dir").map(String::as_str) {
            None | Some("asc") => false,
            Some("desc") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "Invalid sort direction: {:?}. Acceptable values are 'asc' or 'desc'.",
                    cut(other)
                )))
            }
        };
        Ok(Page {
            limit,
            marker,
            sort_key,
            descending,
        })
    }

    /// Sorts (stable, by the rendered value of `sort_key`; `id` is creation order), then cuts
    /// the page after `marker`. `key` renders a record's sort value, `uuid` names it.
    pub fn apply<T>(
        &self,
        mut items: Vec<T>,
        key: impl Fn(&T, &str) -> Value,
        uuid: impl Fn(&T) -> Uuid,
    ) -> Result<Vec<T>, ApiError> {
        if self.sort_key != "id" {
            items.sort_by(|a, b| compare(&key(a, &self.sort_key), &key(b, &self.sort_key)));
        }
        if self.descending {
            items.reverse();
        }
        let start = match self.marker {
            None => 0,
            Some(marker) => {
                items
                    .iter()
                    .position(|item| uuid(item) == marker)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "Invalid value for parameter \"marker\": {marker} is not in the list."
                        ))
                    })?
                    + 1
            }
        };
        let items: Vec<T> = items.into_iter().skip(start).collect();
        Ok(match self.limit {
            Some(limit) => items.into_iter().take(limit).collect(),
            None => items,
        })
    }

    /// The list document of `items`: sorted and cut by [`Page::apply`] (`document` renders a
    /// record's full document, whose fields the sort key names), each rendered by `render`,
    /// with a `next` link when the page is full.
    pub fn respond<T>(
        &self,
        items: Vec<T>,
        listing: Listing<'_>,
        document: impl Fn(&T) -> Value,
        uuid: impl Fn(&T) -> Uuid,
        render: impl Fn(&T) -> Value,
    ) -> Result<Json<Value>, ApiError> {
        let items = self.apply(
            items,
            |item, key| document(item).get(key).cloned().unwrap_or(Value::Null),
            &uuid,
        )?;
        let count = items.len();
        let last = items.last().map(|item| uuid(item).to_string());
        let out: Vec<Value> = items.iter().map(render).collect();
        let mut doc = json!({ listing.collection: out });
        if let Some(next) = render::next_link(listing.ctx, listing.path, self.limit, count, last) {
            doc["next"] = json!(next);
        }
        Ok(Json(doc))
    }
}

/// Orders JSON scalars: nulls first, then numbers, booleans and strings by value.
fn compare(a: &Value, b: &Value) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Less,
        (_, Value::Null) => Ordering::Greater,
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .partial_cmp(&y.as_f64())
            .unwrap_or(Ordering::Equal),
        (Value::String(x), Value::String(y)) => x.cmp(y),
        _ => a.to_string().cmp(&b.to_string()),
    }
}
