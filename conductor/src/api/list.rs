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
use crate::store::order::Order;
use crate::store::StoreError;

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

/// Pagination and sorting of a list query, carried out by the store (`store::order`).
pub(super) struct Page {
    /// At most this many: `limit`, never above `api.max_limit`, which is also the default.
    pub limit: usize,
    /// Start after this record.
    pub marker: Option<Uuid>,
    /// The order.
    pub order: Order,
    /// The query's other parameters (filters, `sort_key`, `sort_dir`, `fields`, `detail`),
    /// repeated in the `next` link so the next page continues the same list.
    pub carried: Vec<(String, String)>,
}

impl Page {
    /// From `limit`, `marker`, `sort_key`, `sort_dir`; `sortable` lists the keys allowed,
    /// `max_limit` bounds the page (Ironic's `[api] max_limit`).
    pub fn parse(
        query: &HashMap<String, String>,
        sortable: &[&'static str],
        max_limit: usize,
    ) -> Result<Page, ApiError> {
        let limit = match query.get("limit") {
            None => None,
            Some(v) => Some(v.parse::<usize>().map_err(|_| {
                ApiError::bad_request(format!(
                    "Invalid value for parameter \"limit\": {:?} (expected a non-negative integer).",
                    cut(v)
                ))
            })?),
        }
        // Ironic: 0 means no limit, which is max_limit.
        .filter(|l| *l > 0)
        .map_or(max_limit, |l| l.min(max_limit));
        let marker = match query.get("marker") {
            None => None,
            Some(v) => Some(body::parse_uuid(v, "marker")?),
        };
        let sort_key = query.get("sort_key").map_or("id", String::as_str);
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
        let order = Order::by(sortable, sort_key, descending).ok_or_else(|| {
            ApiError::bad_request(format!(
                "The sort_key value {:?} is an invalid field for sorting (use one of: {}).",
                cut(sort_key),
                sortable.join(", ")
            ))
        })?;
        let mut carried: Vec<(String, String)> = query
            .iter()
            .filter(|(k, _)| k.as_str() != "limit" && k.as_str() != "marker")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        carried.sort();
        Ok(Page {
            limit,
            marker,
            order,
            carried,
        })
    }

    /// A store error of the list: a marker that names no record is the request's fault (400).
    pub fn store_error(&self, e: StoreError) -> ApiError {
        match (&e, self.marker) {
            (StoreError::NotFound { ident, .. }, Some(marker)) if *ident == marker.to_string() => {
                ApiError::bad_request(format!(
                    "Invalid value for parameter \"marker\": {marker} is not in the list."
                ))
            }
            _ => ApiError::from(e),
        }
    }

    /// The list document of `items` (one page, in order, from the store), each rendered by
    /// `render`, with a `next` link when the page is full.
    pub fn respond<T>(
        &self,
        items: Vec<T>,
        listing: Listing<'_>,
        uuid: impl Fn(&T) -> Uuid,
        render: impl Fn(&T) -> Value,
    ) -> Json<Value> {
        let count = items.len();
        let last = items.last().map(|item| uuid(item).to_string());
        let out: Vec<Value> = items.iter().map(render).collect();
        let mut doc = json!({ listing.collection: out });
        if let Some(next) = render::next_link(
            listing.ctx,
            listing.path,
            self.limit,
            count,
            last,
            &self.carried,
        ) {
            doc["next"] = json!(next);
        }
        Json(doc)
    }
}
