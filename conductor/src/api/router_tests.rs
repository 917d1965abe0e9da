//! The API through its router (tower's `oneshot`), resource by resource: what each request gets
//! back, with the status, headers and fault bodies a client parses.
//!
//! The manager's bodies are another part's work: routes that end in the manager are checked
//! here for what the API decides before the call (parsing, versions, 404/400/406) only.

use http::{Method, StatusCode};
use serde_json::{json, Value};

use super::test_support::{app, call, call_raw, Reply, CONDUCTOR};
use crate::store::{NodeIdent, Store};

const ILO_INFO: &str = r#"{"ilo_address": "10.0.0.9", "ilo_username": "admin", "ilo_password": "s3cret", "ilo_deploy_iso": "http://images/deploy.iso"}"#;

fn driver_info() -> Value {
    serde_json::from_str(ILO_INFO).expect("fixture parses")
}

async fn create_node(router: &axum::Router, name: &str) -> Value {
    let reply = call(
        router,
        Method::POST,
        "/v1/nodes",
        Some(json!({"driver": "agent_ilo", "name": name, "driver_info": driver_info()})),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    reply.json
}

/// The names of the nodes a list answered, in its order.
fn names(reply: &Reply) -> Vec<String> {
    reply.json["nodes"]
        .as_array()
        .expect("list")
        .iter()
        .map(|n| n["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn assert_fault(reply: &Reply, status: StatusCode, words: &str) {
    assert_eq!(reply.status, status, "{}", reply.json);
    let fault = reply.fault();
    assert!(fault.contains(words), "{fault:?} should contain {words:?}");
}

mod root_and_versions {
    use super::*;

    #[tokio::test]
    async fn root_document_names_the_version_range() {
        let (router, _store) = app();
        let reply = call_raw(&router, Method::GET, "/", None, None).await;
        assert_eq!(reply.status, StatusCode::OK);
        let default = &reply.json["default_version"];
        assert_eq!(default["id"], "v1");
        assert_eq!(default["version"], "1.73");
        assert_eq!(default["min_version"], "1.1");
        assert_eq!(default["status"], "CURRENT");
        assert_eq!(default["links"][0]["href"], "http://api.test:6385/v1/");
        assert_eq!(reply.json["versions"][0], *default);
        assert_eq!(
            reply.header("x-openstack-ironic-api-maximum-version"),
            Some("1.73")
        );
    }

    #[tokio::test]
    async fn v1_document_and_version_headers() {
        let (router, _store) = app();
        for path in ["/v1", "/v1/"] {
            let reply = call_raw(&router, Method::GET, path, None, None).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}");
            assert_eq!(reply.json["id"], "v1");
            assert_eq!(reply.json["version"]["version"], "1.73");
            assert!(reply.json["nodes"][0]["href"]
                .as_str()
                .is_some_and(|h| h.ends_with("/v1/nodes/")));
            assert_eq!(
                reply.header("x-openstack-ironic-api-minimum-version"),
                Some("1.1")
            );
            assert_eq!(
                reply.header("x-openstack-ironic-api-maximum-version"),
                Some("1.73")
            );
            // No header: the minimum.
            assert_eq!(reply.header("x-openstack-ironic-api-version"), Some("1.1"));
        }
        let reply = call_raw(&router, Method::GET, "/v1/nodes", Some("1.38"), None).await;
        assert_eq!(reply.header("x-openstack-ironic-api-version"), Some("1.38"));
        let reply = call_raw(&router, Method::GET, "/v1/nodes", Some("latest"), None).await;
        assert_eq!(reply.header("x-openstack-ironic-api-version"), Some("1.73"));
    }

    #[tokio::test]
    async fn versions_outside_the_range_are_406_with_the_range() {
        let (router, _store) = app();
        for v in ["1.115", "1.0", "2.1", "bogus"] {
            let reply = call_raw(&router, Method::GET, "/v1/nodes", Some(v), None).await;
            assert_eq!(reply.status, StatusCode::NOT_ACCEPTABLE, "{v}");
            reply.fault();
            assert_eq!(
                reply.header("x-openstack-ironic-api-minimum-version"),
                Some("1.1")
            );
            assert_eq!(
                reply.header("x-openstack-ironic-api-maximum-version"),
                Some("1.73")
            );
        }
        // The generic header, as keystoneauth sends it.
        let req = http::Request::builder()
            .uri("/v1/nodes")
            .header("OpenStack-API-Version", "baremetal 1.50")
            .body(axum::body::Body::empty())
            .expect("request");
        let response = tower::ServiceExt::oneshot(router, req)
            .await
            .expect("infallible");
        assert_eq!(response.headers()["x-openstack-ironic-api-version"], "1.50");
    }

    #[tokio::test]
    async fn framework_errors_get_fault_bodies() {
        let (router, _store) = app();
        let reply = call(&router, Method::GET, "/v1/chassis", None).await;
        assert_fault(&reply, StatusCode::NOT_FOUND, "/v1/chassis");
        let reply = call(&router, Method::POST, "/v1/drivers", Some(json!({}))).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
        reply.fault();
        assert_eq!(
            reply.header("x-openstack-ironic-api-maximum-version"),
            Some("1.73")
        );
        let big = format!(
            "{{\"driver\": \"agent_ilo\", \"extra\": {{\"x\": \"{}\"}}}}",
            "a".repeat(super::super::DEFAULT_MAX_BODY)
        );
        let reply = call_raw(
            &router,
            Method::POST,
            "/v1/nodes",
            Some("latest"),
            Some(big.into_bytes()),
        )
        .await;
        assert_fault(&reply, StatusCode::PAYLOAD_TOO_LARGE, "larger than");
        let reply = call_raw(
            &router,
            Method::POST,
            "/v1/nodes",
            Some("latest"),
            Some(b"{\"driver\":".to_vec()),
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "not valid JSON");
    }
}

mod nodes {
    use super::*;

    #[tokio::test]
    async fn create_show_and_list_with_secrets_masked() {
        let (router, store) = app();
        let node = create_node(&router, "node-1").await;
        assert_eq!(node["provision_state"], "enroll");
        assert_eq!(node["driver_info"]["ilo_password"], "******");
        assert_eq!(node["driver_info"]["ilo_address"], "10.0.0.9");
        assert_eq!(node["conductor"], CONDUCTOR);
        assert_eq!(node["deploy_interface"], "direct");
        let uuid = node["uuid"].as_str().expect("uuid").to_string();
        // The store holds the real password; only the API masks it.
        let stored = store
            .node(&NodeIdent::Name("node-1".into()))
            .await
            .expect("stored");
        assert_eq!(stored.driver_info["ilo_password"], "s3cret");

        for ident in [uuid.as_str(), "node-1"] {
            let reply = call(&router, Method::GET, &format!("/v1/nodes/{ident}"), None).await;
            assert_eq!(reply.status, StatusCode::OK);
            assert_eq!(reply.json["uuid"], uuid.as_str());
            assert_eq!(reply.json["driver_info"]["ilo_password"], "******");
        }
        let reply = call(&router, Method::GET, "/v1/nodes", None).await;
        let nodes = reply.json["nodes"].as_array().expect("list");
        assert_eq!(nodes.len(), 1);
        let mut keys: Vec<&String> = nodes[0].as_object().expect("object").keys().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "instance_uuid",
                "links",
                "maintenance",
                "name",
                "power_state",
                "provision_state",
                "uuid"
            ]
        );
        for path in ["/v1/nodes/detail", "/v1/nodes?detail=true"] {
            let reply = call(&router, Method::GET, path, None).await;
            assert_eq!(
                reply.json["nodes"][0]["driver_info"]["ilo_password"], "******",
                "{path}"
            );
        }
        let reply = call(&router, Method::GET, "/v1/nodes?fields=uuid,driver", None).await;
        assert_eq!(
            reply.json["nodes"][0],
            json!({"uuid": uuid, "driver": "agent_ilo"})
        );
        let reply = call(
            &router,
            Method::GET,
            &format!("/v1/nodes/{uuid}?fields=name"),
            None,
        )
        .await;
        assert_eq!(reply.json, json!({"name": "node-1"}));
    }

    #[tokio::test]
    async fn create_before_1_11_starts_available_and_given_uuids_are_kept() {
        let (router, _store) = app();
        let uuid = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
        let body = json!({"driver": "agent_ilo", "uuid": uuid})
            .to_string()
            .into_bytes();
        let reply = call_raw(
            &router,
            Method::POST,
            "/v1/nodes",
            Some("1.10"),
            Some(body.clone()),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED);
        assert_eq!(reply.json["uuid"], uuid);
        assert_eq!(reply.json["provision_state"], "available");
        assert_eq!(
            reply.header("location"),
            Some(format!("http://api.test:6385/v1/nodes/{uuid}").as_str())
        );
        let reply = call_raw(&router, Method::POST, "/v1/nodes", Some("1.10"), Some(body)).await;
        assert_fault(&reply, StatusCode::CONFLICT, uuid);
        // 1.1 shows `available` as null.
        let reply = call_raw(
            &router,
            Method::GET,
            &format!("/v1/nodes/{uuid}"),
            None,
            None,
        )
        .await;
        assert!(reply.json["provision_state"].is_null(), "{}", reply.json);
        assert!(reply.json.get("name").is_none());
    }

    #[tokio::test]
    async fn bad_creates_name_the_field() {
        let (router, _store) = app();
        let cases: Vec<(Value, StatusCode, &str)> = vec![
            (json!({}), StatusCode::BAD_REQUEST, "\"driver\""),
            (json!({"driver": 5}), StatusCode::BAD_REQUEST, "\"driver\""),
            (
                json!({"driver": "ipmi"}),
                StatusCode::BAD_REQUEST,
                "\"driver\"",
            ),
            (
                json!({"driver": "agent_ilo", "driver_info": "x"}),
                StatusCode::BAD_REQUEST,
                "\"driver_info\"",
            ),
            (
                json!({"driver": "agent_ilo", "properties": [1]}),
                StatusCode::BAD_REQUEST,
                "\"properties\"",
            ),
            (
                json!({"driver": "agent_ilo", "provision_state": "active"}),
                StatusCode::BAD_REQUEST,
                "provision_state",
            ),
            (
                json!({"driver": "agent_ilo", "bogus": 1}),
                StatusCode::BAD_REQUEST,
                "bogus",
            ),
            (
                json!({"driver": "agent_ilo", "uuid": "not-a-uuid"}),
                StatusCode::BAD_REQUEST,
                "\"uuid\"",
            ),
            (
                json!({"driver": "agent_ilo", "name": "has space"}),
                StatusCode::BAD_REQUEST,
                "\"name\"",
            ),
            (
                json!({"driver": "agent_ilo", "instance_uuid": "x"}),
                StatusCode::BAD_REQUEST,
                "\"instance_uuid\"",
            ),
            (json!([1, 2]), StatusCode::BAD_REQUEST, "JSON object"),
            (json!("node"), StatusCode::BAD_REQUEST, "JSON object"),
        ];
        for (body, status, words) in cases {
            let reply = call(&router, Method::POST, "/v1/nodes", Some(body.clone())).await;
            assert_fault(&reply, status, words);
        }
        create_node(&router, "twin").await;
        let reply = call(
            &router,
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "agent_ilo", "name": "twin"})),
        )
        .await;
        assert_fault(&reply, StatusCode::CONFLICT, "twin");
    }

    #[tokio::test]
    async fn unknown_and_malformed_idents() {
        let (router, _store) = app();
        let reply = call(
            &router,
            Method::GET,
            "/v1/nodes/1be26c0b-03f2-4d2e-ae87-c02d7f33c123/",
            None,
        )
        .await;
        assert_fault(
            &reply,
            StatusCode::NOT_FOUND,
            "1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
        );
        let reply = call(&router, Method::GET, "/v1/nodes/no-such-name", None).await;
        assert_fault(&reply, StatusCode::NOT_FOUND, "no-such-name");
        let reply = call(&router, Method::GET, "/v1/nodes/bad%20name", None).await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "logical name or UUID");
        let reply = call_raw(
            &router,
            Method::GET,
            "/v1/nodes/some-name",
            Some("1.4"),
            None,
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "Expected a UUID");
    }

    #[tokio::test]
    async fn list_filters_and_pagination() {
        let (router, store) = app();
        let mut uuids = Vec::new();
        for i in 0..4 {
            let node = create_node(&router, &format!("n{i}")).await;
            uuids.push(node["uuid"].as_str().expect("uuid").to_string());
        }
        let mut node = store.node(&NodeIdent::Name("n1".into())).await.expect("n1");
        node.provision_state = crate::states::ProvisionState::Available;
        node.maintenance = true;
        node.instance_uuid = Some("0d3c4c52-9b54-4d0f-a5f5-3d2a3c58e0a1".into());
        store.update_node(&node).await.expect("update");
        let cases: &[(&str, &[&str])] = &[
            ("provision_state=available", &["n1"]),
            ("provision_state=enroll", &["n0", "n2", "n3"]),
            ("maintenance=true", &["n1"]),
            ("maintenance=false", &["n0", "n2", "n3"]),
            ("associated=true", &["n1"]),
            (
                "instance_uuid=0d3c4c52-9b54-4d0f-a5f5-3d2a3c58e0a1",
                &["n1"],
            ),
            ("driver=agent_ilo", &["n0", "n1", "n2", "n3"]),
            ("driver=redfish", &[]),
            ("limit=2", &["n0", "n1"]),
            ("sort_key=name&sort_dir=desc", &["n3", "n2", "n1", "n0"]),
        ];
        for (query, want) in cases {
            let reply = call(&router, Method::GET, &format!("/v1/nodes?{query}"), None).await;
            assert_eq!(reply.status, StatusCode::OK, "{query}: {}", reply.json);
            assert_eq!(names(&reply), *want, "{query}");
        }
        let reply = call(&router, Method::GET, "/v1/nodes?limit=2", None).await;
        let next = reply.json["next"].as_str().expect("next link");
        assert!(next.contains(&format!("marker={}", uuids[1])), "{next}");
        let reply = call(
            &router,
            Method::GET,
            &format!("/v1/nodes?limit=2&marker={}", uuids[1]),
            None,
        )
        .await;
        assert_eq!(names(&reply), ["n2", "n3"]);
        for (query, words) in [
            ("provision_state=bogus", "provision_state"),
            ("maintenance=perhaps", "maintenance"),
            ("limit=-1", "limit"),
            ("marker=zzz", "marker"),
            ("sort_key=driver_info", "sort_key"),
            ("sort_dir=up", "sort direction"),
            ("fields=uuid,bogus", "bogus"),
            ("fields=uuid&detail=true", "mutually exclusive"),
        ] {
            let reply = call(&router, Method::GET, &format!("/v1/nodes?{query}"), None).await;
            assert_fault(&reply, StatusCode::BAD_REQUEST, words);
        }
    }

    /// `GET /v1/conductors` (1.49) lists the registered conductors, `detail` adds drivers and
    /// times; below 1.49 the resource does not exist.
    #[tokio::test]
    async fn conductors_are_listed_from_their_registrations() {
        let (router, store) = app();
        let now = crate::store::now();
        store
            .register_conductor(&crate::store::ConductorRecord {
                hostname: "cond-x".into(),
                conductor_group: "rack-7".into(),
                drivers: vec!["agent_ilo".into()],
                api_url: Some("https://cond-x.example:6385".into()),
                created_at: now,
                updated_at: now,
            })
            .await
            .expect("registering");
        let reply = call(&router, Method::GET, "/v1/conductors", None).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        let list = reply.json["conductors"].as_array().expect("a list").clone();
        assert_eq!(list.len(), 1, "{}", reply.json);
        assert_eq!(list[0]["hostname"], "cond-x");
        assert_eq!(list[0]["conductor_group"], "rack-7");
        assert_eq!(list[0]["alive"], true);
        assert!(list[0].get("drivers").is_none(), "short form: {}", list[0]);
        let reply = call(&router, Method::GET, "/v1/conductors?detail=true", None).await;
        assert_eq!(reply.json["conductors"][0]["drivers"], json!(["agent_ilo"]));
        let reply = call(&router, Method::GET, "/v1/conductors/cond-x", None).await;
        assert_eq!(reply.json["hostname"], "cond-x");
        assert!(reply.json["updated_at"].is_string(), "{}", reply.json);
        let reply = call(&router, Method::GET, "/v1/conductors/nobody", None).await;
        assert_fault(&reply, StatusCode::NOT_FOUND, "nobody");
        let reply = call_raw(&router, Method::GET, "/v1/conductors", Some("1.48"), None).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
    }

    /// Following `next` links walks the whole list in the asked order, filters kept, and a
    /// page never holds more than `api.max_limit` records.
    #[tokio::test]
    async fn next_links_keep_the_sort_and_filters_and_max_limit_caps_a_page() {
        let (router, store) = crate::api::test_support::app_with(crate::api::ApiOptions {
            max_limit: 3,
            ..Default::default()
        });
        for name in ["m3", "m0", "x9", "m4", "m1", "m2", "m5"] {
            create_node(&router, name).await;
        }
        let mut x9 = store.node(&NodeIdent::Name("x9".into())).await.expect("x9");
        x9.maintenance = true;
        store.update_node(&x9).await.expect("update");
        let mut seen = Vec::new();
        let mut next = Some("/v1/nodes?maintenance=false&sort_key=name&sort_dir=desc".to_string());
        let mut pages = 0;
        while let Some(url) = next.take() {
            let path = url.trim_start_matches("http://localhost");
            let reply = call(&router, Method::GET, path, None).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}: {}", reply.json);
            let page = reply.json["nodes"].as_array().expect("a list").clone();
            assert!(page.len() <= 3, "max_limit caps the page: {}", reply.json);
            seen.extend(
                page.iter()
                    .map(|n| n["name"].as_str().unwrap_or("").to_string()),
            );
            next = reply.json["next"].as_str().map(|link| {
                assert!(link.contains("sort_key=name"), "{link}");
                assert!(link.contains("sort_dir=desc"), "{link}");
                assert!(link.contains("maintenance=false"), "{link}");
                let at = link.find("/v1/").expect("a /v1 link");
                link[at..].to_string()
            });
            pages += 1;
            assert!(pages < 10, "the links go round: {seen:?}");
        }
        assert_eq!(seen, ["m5", "m4", "m3", "m2", "m1", "m0"]);
        // A limit above max_limit is cut to it.
        let reply = call(&router, Method::GET, "/v1/nodes?limit=50", None).await;
        assert_eq!(reply.json["nodes"].as_array().map(Vec::len), Some(3));
        assert!(reply.json["next"]
            .as_str()
            .is_some_and(|l| l.contains("limit=3")));
        // A marker that names no node is the request's fault.
        let reply = call(
            &router,
            Method::GET,
            &format!("/v1/nodes?marker={}", uuid::Uuid::new_v4()),
            None,
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "marker");
    }

    #[tokio::test]
    async fn patch_sets_fields_and_refuses_read_only_ones() {
        let (router, store) = app();
        let node = create_node(&router, "p1").await;
        let uuid = node["uuid"].as_str().expect("uuid").to_string();
        let path = format!("/v1/nodes/{uuid}");
        let patch = json!([
            {"op": "add", "path": "/instance_info/image_source", "value": "http://images/os.qcow2"},
            {"op": "add", "path": "/instance_info/configdrive", "value": "H4sIsecret"},
            {"op": "replace", "path": "/driver_info/ilo_password", "value": "new-pass"},
            {"op": "add", "path": "/properties/capabilities", "value": "boot_mode:uefi"},
            {"op": "add", "path": "/extra/rack", "value": 7},
            {"op": "replace", "path": "/name", "value": "p1-renamed"},
            {"op": "add", "path": "/instance_uuid", "value": "0d3c4c52-9b54-4d0f-a5f5-3d2a3c58e0a1"},
        ]);
        let reply = call(&router, Method::PATCH, &path, Some(patch)).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        assert_eq!(
            reply.json["instance_info"]["image_source"],
            "http://images/os.qcow2"
        );
        assert_eq!(reply.json["instance_info"]["configdrive"], "******");
        assert_eq!(reply.json["driver_info"]["ilo_password"], "******");
        assert_eq!(reply.json["name"], "p1-renamed");
        let stored = store
            .node(&NodeIdent::Name("p1-renamed".into()))
            .await
            .expect("stored");
        assert_eq!(stored.driver_info["ilo_password"], "new-pass");
        assert_eq!(stored.properties["capabilities"], "boot_mode:uefi");
        assert_eq!(
            stored.reservation, None,
            "the patch releases its reservation"
        );

        let refused: Vec<(Value, &str)> = vec![
            (
                json!([{"op": "replace", "path": "/provision_state", "value": "active"}]),
                "'/provision_state' is an internal attribute",
            ),
            (
                json!([{"op": "add", "path": "/driver_internal_info/x", "value": 1}]),
                "'/driver_internal_info'",
            ),
            (
                json!([{"op": "replace", "path": "/uuid", "value": "x"}]),
                "'/uuid'",
            ),
            (
                json!([{"op": "replace", "path": "/last_error", "value": "x"}]),
                "'/last_error'",
            ),
            (
                json!([{"op": "replace", "path": "/reservation", "value": "x"}]),
                "'/reservation'",
            ),
            (
                json!([{"op": "remove", "path": "/driver"}]),
                "'/driver' is a mandatory attribute",
            ),
            (
                json!([{"op": "replace", "path": "/driver", "value": "ipmi"}]),
                "\"driver\"",
            ),
            (
                json!([{"op": "replace", "path": "/driver_info", "value": "flat"}]),
                "\"driver_info\"",
            ),
            (
                json!([{"op": "replace", "path": "/maintenance", "value": "perhaps"}]),
                "\"maintenance\"",
            ),
            (
                json!([{"op": "move", "path": "/extra/a", "from": "/extra/rack"}]),
                "\"op\"",
            ),
            (
                json!([{"op": "remove", "path": "/extra/none"}]),
                "does not exist",
            ),
            (json!({"op": "add"}), "JSON Patch"),
        ];
        for (patch, words) in refused {
            let reply = call(&router, Method::PATCH, &path, Some(patch)).await;
            assert_fault(&reply, StatusCode::BAD_REQUEST, words);
        }
        // A node held by a task: 409 NodeLocked, and the holder keeps its lock.
        store
            .reserve_node(stored.uuid, "other-conductor")
            .await
            .expect("reserve");
        let reply = call(
            &router,
            Method::PATCH,
            &path,
            Some(json!([{"op": "add", "path": "/extra/x", "value": 1}])),
        )
        .await;
        assert_fault(
            &reply,
            StatusCode::CONFLICT,
            "locked by host other-conductor",
        );
        let held = store
            .node(&NodeIdent::Uuid(stored.uuid))
            .await
            .expect("node");
        assert_eq!(held.reservation.as_deref(), Some("other-conductor"));
        assert!(!held.extra.contains_key("x"));
        let reply = call(&router, Method::PATCH, "/v1/nodes/nobody", Some(json!([]))).await;
        assert_fault(&reply, StatusCode::NOT_FOUND, "nobody");
    }

    #[tokio::test]
    async fn maintenance_by_patch_and_delete_of_unknown_nodes() {
        let (router, _store) = app();
        let node = create_node(&router, "m1").await;
        let path = format!("/v1/nodes/{}", node["uuid"].as_str().expect("uuid"));
        let reply = call(
            &router,
            Method::PATCH,
            &path,
            Some(json!([{"op": "replace", "path": "/maintenance", "value": true}])),
        )
        .await;
        assert_eq!(reply.json["maintenance"], true);
        let reply = call(
            &router,
            Method::PATCH,
            &path,
            Some(json!([{"op": "replace", "path": "/maintenance", "value": false}])),
        )
        .await;
        assert_eq!(reply.json["maintenance"], false);
        let reply = call(&router, Method::DELETE, "/v1/nodes/ghost", None).await;
        assert_fault(&reply, StatusCode::NOT_FOUND, "ghost");
    }

    /// `conductor_group` (1.46): shown from 1.46 on, taken at create and by PATCH in lower case,
    /// the default group when empty or removed.
    #[tokio::test]
    async fn conductor_group_is_shown_from_1_46_and_set_in_lower_case() {
        let (router, store) = app();
        let reply = call(
            &router,
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": "agent_ilo", "name": "g1", "conductor_group": "Rack-1.Row_2"})),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
        assert_eq!(reply.json["conductor_group"], "rack-1.row_2");
        let node = create_node(&router, "g2").await;
        assert_eq!(node["conductor_group"], "", "the default group");

        let reply = call_raw(&router, Method::GET, "/v1/nodes/g1", Some("1.45"), None).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        assert!(
            reply.json.get("conductor_group").is_none(),
            "{}",
            reply.json
        );
        let reply = call_raw(&router, Method::GET, "/v1/nodes/g1", Some("1.46"), None).await;
        assert_eq!(reply.json["conductor_group"], "rack-1.row_2");
        let reply = call_raw(
            &router,
            Method::GET,
            "/v1/nodes/g1?fields=conductor_group",
            Some("1.46"),
            None,
        )
        .await;
        assert_eq!(reply.json, json!({"conductor_group": "rack-1.row_2"}));

        let patch =
            |value: Value| json!([{"op": "replace", "path": "/conductor_group", "value": value}]);
        let reply = call(
            &router,
            Method::PATCH,
            "/v1/nodes/g2",
            Some(patch(json!("RACK-2"))),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        assert_eq!(reply.json["conductor_group"], "rack-2");
        let stored = store
            .node(&NodeIdent::Name("g2".into()))
            .await
            .expect("stored");
        assert_eq!(stored.conductor_group, "rack-2");
        // A patch of other fields keeps the group.
        let reply = call(
            &router,
            Method::PATCH,
            "/v1/nodes/g2",
            Some(json!([{"op": "add", "path": "/extra/k", "value": 1}])),
        )
        .await;
        assert_eq!(reply.json["conductor_group"], "rack-2", "{}", reply.json);
        // Removed or null: back to the default group.
        for ops in [
            json!([{"op": "remove", "path": "/conductor_group"}]),
            patch(Value::Null),
        ] {
            call(
                &router,
                Method::PATCH,
                "/v1/nodes/g2",
                Some(patch(json!("x"))),
            )
            .await;
            let reply = call(&router, Method::PATCH, "/v1/nodes/g2", Some(ops.clone())).await;
            assert_eq!(reply.status, StatusCode::OK, "{ops}: {}", reply.json);
            assert_eq!(reply.json["conductor_group"], "", "{ops}");
        }
        // The longest group Ironic keeps.
        let longest = "a".repeat(255);
        let reply = call(
            &router,
            Method::PATCH,
            "/v1/nodes/g2",
            Some(patch(json!(longest))),
        )
        .await;
        assert_eq!(reply.json["conductor_group"], longest.as_str());
    }

    /// A conductor group outside Ironic's rule is 400 naming the field, at create and by
    /// PATCH, and changes nothing; before 1.46 the field is refused with 406 (Ironic's answer
    /// for a field of a newer version), except the default group at create.
    #[tokio::test]
    async fn bad_conductor_groups_are_400_and_older_versions_406() {
        let (router, store) = app();
        create_node(&router, "g1").await;
        let long = "a".repeat(256);
        let bad: Vec<Value> = vec![
            json!("has space"),
            json!("rack:1"),
            json!("rack/1"),
            json!("rück"),
            json!(long),
            json!(5),
            json!(["rack-1"]),
        ];
        for value in bad {
            let reply = call(
                &router,
                Method::POST,
                "/v1/nodes",
                Some(json!({"driver": "agent_ilo", "conductor_group": value})),
            )
            .await;
            assert_fault(&reply, StatusCode::BAD_REQUEST, "\"conductor_group\"");
            let reply = call(
                &router,
                Method::PATCH,
                "/v1/nodes/g1",
                Some(json!([{"op": "add", "path": "/conductor_group", "value": value}])),
            )
            .await;
            assert_fault(&reply, StatusCode::BAD_REQUEST, "\"conductor_group\"");
        }
        let reply = call(
            &router,
            Method::PATCH,
            "/v1/nodes/g1",
            Some(json!([{"op": "add", "path": "/conductor_group", "value": "has space"}])),
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "is not a conductor group");
        let stored = store
            .node(&NodeIdent::Name("g1".into()))
            .await
            .expect("stored");
        assert_eq!(stored.conductor_group, "");
        assert_eq!(
            stored.reservation, None,
            "a refused patch releases the node"
        );
        assert_eq!(
            store
                .list_nodes(&Default::default())
                .await
                .expect("listing")
                .len(),
            1,
            "no refused create made a node"
        );

        let body = |v: Value| Some(v.to_string().into_bytes());
        let reply = call_raw(
            &router,
            Method::POST,
            "/v1/nodes",
            Some("1.45"),
            body(json!({"driver": "agent_ilo", "conductor_group": "rack-1"})),
        )
        .await;
        assert_fault(&reply, StatusCode::NOT_ACCEPTABLE, "1.46");
        let reply = call_raw(
            &router,
            Method::PATCH,
            "/v1/nodes/g1",
            Some("1.45"),
            body(json!([{"op": "replace", "path": "/conductor_group", "value": "rack-1"}])),
        )
        .await;
        assert_fault(&reply, StatusCode::NOT_ACCEPTABLE, "1.46");
        let reply = call_raw(
            &router,
            Method::POST,
            "/v1/nodes",
            Some("1.45"),
            body(json!({"driver": "agent_ilo", "name": "g2", "conductor_group": ""})),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
    }

    /// `GET /v1/nodes?conductor_group=` (1.46) lists the group's nodes, in any case; an empty
    /// value is the default group; the `next` link keeps the filter.
    #[tokio::test]
    async fn nodes_are_listed_by_conductor_group() {
        let (router, _store) = app();
        for (name, group) in [
            ("a1", "rack-a"),
            ("d1", ""),
            ("a2", "Rack-A"),
            ("b1", "rack-b"),
        ] {
            let reply = call(
                &router,
                Method::POST,
                "/v1/nodes",
                Some(json!({"driver": "agent_ilo", "name": name, "conductor_group": group})),
            )
            .await;
            assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
        }
        let cases: &[(&str, &[&str])] = &[
            ("conductor_group=rack-a", &["a1", "a2"]),
            ("conductor_group=RACK-A", &["a1", "a2"]),
            ("conductor_group=rack-b", &["b1"]),
            ("conductor_group=", &["d1"]),
            ("conductor_group=rack-z", &[]),
            (
                "conductor_group=rack-a&sort_key=name&sort_dir=desc",
                &["a2", "a1"],
            ),
        ];
        for (query, want) in cases {
            let reply = call(&router, Method::GET, &format!("/v1/nodes?{query}"), None).await;
            assert_eq!(reply.status, StatusCode::OK, "{query}: {}", reply.json);
            assert_eq!(names(&reply), *want, "{query}");
        }
        let reply = call(
            &router,
            Method::GET,
            "/v1/nodes?conductor_group=rack-a&limit=1",
            None,
        )
        .await;
        assert_eq!(names(&reply), ["a1"]);
        let next = reply.json["next"].as_str().expect("a next link");
        assert!(next.contains("conductor_group=rack-a"), "{next}");
        let reply = call_raw(
            &router,
            Method::GET,
            "/v1/nodes?conductor_group=rack-a",
            Some("1.45"),
            None,
        )
        .await;
        assert_fault(&reply, StatusCode::NOT_ACCEPTABLE, "1.46");
    }
}

mod node_states {
    use super::*;

    #[tokio::test]
    async fn states_document() {
        let (router, _store) = app();
        let node = create_node(&router, "s1").await;
        let reply = call(&router, Method::GET, "/v1/nodes/s1/states", None).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.json["provision_state"], "enroll");
        assert!(reply.json["power_state"].is_null());
        assert!(reply.json["target_provision_state"].is_null());
        assert_eq!(reply.json["console_enabled"], false);
        assert!(node["uuid"].is_string());
    }

    #[tokio::test]
    async fn power_requests_are_checked_before_the_manager() {
        let (router, _store) = app();
        create_node(&router, "pw").await;
        let cases: Vec<(Option<&str>, Value, StatusCode, &str)> = vec![
            (
                None,
                json!({"target": "power up"}),
                StatusCode::BAD_REQUEST,
                "\"target\"",
            ),
            (None, json!({}), StatusCode::BAD_REQUEST, "\"target\""),
            (
                None,
                json!({"target": 1}),
                StatusCode::BAD_REQUEST,
                "\"target\"",
            ),
            (
                None,
                json!({"target": "power on", "timeout": -5}),
                StatusCode::BAD_REQUEST,
                "\"timeout\"",
            ),
            (
                None,
                json!({"target": "power on", "timeout": "10"}),
                StatusCode::BAD_REQUEST,
                "\"timeout\"",
            ),
            (
                None,
                json!({"target": "power on", "force": true}),
                StatusCode::BAD_REQUEST,
                "force",
            ),
            (
                Some("1.26"),
                json!({"target": "soft power off"}),
                StatusCode::NOT_ACCEPTABLE,
                "1.27",
            ),
            (
                Some("1.26"),
                json!({"target": "power on", "timeout": 10}),
                StatusCode::NOT_ACCEPTABLE,
                "1.27",
            ),
        ];
        for (version, body, status, words) in cases {
            let reply = call_raw(
                &router,
                Method::PUT,
                "/v1/nodes/pw/states/power",
                Some(version.unwrap_or("latest")),
                Some(body.to_string().into_bytes()),
            )
            .await;
            assert_fault(&reply, status, words);
        }
        let reply = call(
            &router,
            Method::PUT,
            "/v1/nodes/nobody/states/power",
            Some(json!({"target": "power on"})),
        )
        .await;
        assert_fault(&reply, StatusCode::NOT_FOUND, "nobody");
    }

    #[tokio::test]
    async fn provision_requests_are_checked_before_the_manager() {
        let (router, _store) = app();
        create_node(&router, "pv").await;
        let cases: Vec<(&str, Value, StatusCode, &str)> = vec![
            (
                "latest",
                json!({"target": "fly"}),
                StatusCode::BAD_REQUEST,
                "\"target\"",
            ),
            (
                "latest",
                json!({"target": "inspect"}),
                StatusCode::BAD_REQUEST,
                "not supported",
            ),
            ("latest", json!({}), StatusCode::BAD_REQUEST, "\"target\""),
            (
                "latest",
                json!({"target": "manage", "configdrive": "abc"}),
                StatusCode::BAD_REQUEST,
                "config drive",
            ),
            (
                "latest",
                json!({"target": "active", "configdrive": 5}),
                StatusCode::BAD_REQUEST,
                "\"configdrive\"",
            ),
            (
                "latest",
                json!({"target": "active", "clean_steps": []}),
                StatusCode::BAD_REQUEST,
                "clean_steps",
            ),
            // The node is in `enroll`: Ironic's InvalidStateRequested.
            (
                "latest",
                json!({"target": "active"}),
                StatusCode::BAD_REQUEST,
                "while it is in state \"enroll\"",
            ),
            (
                "latest",
                json!({"target": "provide"}),
                StatusCode::BAD_REQUEST,
                "while it is in state \"enroll\"",
            ),
            (
                "1.3",
                json!({"target": "manage"}),
                StatusCode::NOT_ACCEPTABLE,
                "1.4",
            ),
            (
                "1.72",
                json!({"target": "deploy"}),
                StatusCode::NOT_ACCEPTABLE,
                "1.73",
            ),
            (
                "1.34",
                json!({"target": "rebuild", "configdrive": "x"}),
                StatusCode::NOT_ACCEPTABLE,
                "1.35",
            ),
            (
                "1.55",
                json!({"target": "active", "configdrive": {"meta_data": {}}}),
                StatusCode::NOT_ACCEPTABLE,
                "1.56",
            ),
        ];
        for (version, body, status, words) in cases {
            let reply = call_raw(
                &router,
                Method::PUT,
                "/v1/nodes/pv/states/provision",
                Some(version),
                Some(body.to_string().into_bytes()),
            )
            .await;
            assert_fault(&reply, status, words);
        }
    }

    #[tokio::test]
    async fn maintenance_and_boot_device_requests_are_checked() {
        let (router, _store) = app();
        create_node(&router, "bd").await;
        let reply = call(
            &router,
            Method::PUT,
            "/v1/nodes/bd/maintenance",
            Some(json!({"reason": 5})),
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "\"reason\"");
        let reply = call(
            &router,
            Method::PUT,
            "/v1/nodes/bd/maintenance",
            Some(json!({"why": "x"})),
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "why");
        let reply = call(&router, Method::DELETE, "/v1/nodes/ghost/maintenance", None).await;
        assert_fault(&reply, StatusCode::NOT_FOUND, "ghost");
        for (body, words) in [
            (json!({"boot_device": "floppy-disk"}), "\"boot_device\""),
            (json!({}), "\"boot_device\""),
            (
                json!({"boot_device": "pxe", "persistent": "sometimes"}),
                "\"persistent\"",
            ),
        ] {
            let reply = call(
                &router,
                Method::PUT,
                "/v1/nodes/bd/management/boot_device",
                Some(body),
            )
            .await;
            assert_fault(&reply, StatusCode::BAD_REQUEST, words);
        }
        let reply = call(
            &router,
            Method::GET,
            "/v1/nodes/bd/management/boot_device/supported",
            None,
        )
        .await;
        assert_eq!(
            reply.json["supported_boot_devices"],
            json!(["cdrom", "disk", "pxe"])
        );
        let reply = call(&router, Method::GET, "/v1/nodes/ghost/validate", None).await;
        assert_fault(&reply, StatusCode::NOT_FOUND, "ghost");
    }
}

mod ports {
    use super::*;

    #[tokio::test]
    async fn port_lifecycle() {
        let (router, _store) = app();
        let node = create_node(&router, "pn").await;
        let node_uuid = node["uuid"].as_str().expect("uuid").to_string();
        let reply = call(&router, Method::POST, "/v1/ports", Some(json!({"address": "52-54-00-AB-CD-EF", "node_uuid": node_uuid, "extra": {"vif_port_id": "v1"}}))).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
        assert_eq!(reply.json["address"], "52:54:00:ab:cd:ef");
        assert_eq!(reply.json["pxe_enabled"], true);
        let port = reply.json["uuid"].as_str().expect("uuid").to_string();
        let reply = call(
            &router,
            Method::POST,
            "/v1/ports",
            Some(json!({"address": "52:54:00:ab:cd:ef", "node_uuid": node_uuid})),
        )
        .await;
        assert_fault(&reply, StatusCode::CONFLICT, "52:54:00:ab:cd:ef");

        let reply = call(&router, Method::GET, "/v1/ports", None).await;
        assert_eq!(
            reply.json["ports"][0].as_object().map(|o| o.len()),
            Some(3),
            "{}",
            reply.json
        );
        for path in [
            "/v1/ports/detail".to_string(),
            "/v1/ports/?detail=True".to_string(),
            format!("/v1/ports/detail?node={node_uuid}"),
            "/v1/ports/detail?node=pn".into(),
            "/v1/ports/detail?address=52:54:00:AB:CD:EF".into(),
            "/v1/nodes/pn/ports/detail".into(),
        ] {
            let reply = call(&router, Method::GET, &path, None).await;
            assert_eq!(
                reply.json["ports"][0]["node_uuid"],
                node_uuid.as_str(),
                "{path}"
            );
        }
        let reply = call(&router, Method::GET, "/v1/nodes/pn/ports", None).await;
        assert_eq!(reply.json["ports"][0]["uuid"], port.as_str());
        let reply = call(
            &router,
            Method::GET,
            "/v1/ports?address=00:00:00:00:00:01",
            None,
        )
        .await;
        assert_eq!(reply.json["ports"], json!([]));

        let reply = call(
            &router,
            Method::PATCH,
            &format!("/v1/ports/{port}"),
            Some(json!([
                {"op": "replace", "path": "/address", "value": "52:54:00:AB:CD:00"},
                {"op": "add", "path": "/extra/switch", "value": "sw1"},
                {"op": "replace", "path": "/pxe_enabled", "value": false},
            ])),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        assert_eq!(reply.json["address"], "52:54:00:ab:cd:00");
        assert_eq!(reply.json["extra"]["switch"], "sw1");
        assert_eq!(reply.json["pxe_enabled"], false);
        for (patch, words) in [
            (
                json!([{"op": "replace", "path": "/uuid", "value": "x"}]),
                "'/uuid'",
            ),
            (
                json!([{"op": "replace", "path": "/address", "value": "nope"}]),
                "\"address\"",
            ),
            (json!([{"op": "remove", "path": "/node_uuid"}]), "mandatory"),
            (
                json!([{"op": "replace", "path": "/node_uuid", "value": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123"}]),
                "\"node_uuid\"",
            ),
        ] {
            let reply = call(
                &router,
                Method::PATCH,
                &format!("/v1/ports/{port}"),
                Some(patch),
            )
            .await;
            assert_fault(&reply, StatusCode::BAD_REQUEST, words);
        }
        let reply = call(&router, Method::DELETE, &format!("/v1/ports/{port}"), None).await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT);
        let reply = call(&router, Method::GET, &format!("/v1/ports/{port}"), None).await;
        assert_fault(&reply, StatusCode::NOT_FOUND, &port);
    }

    #[tokio::test]
    async fn bad_ports_name_the_field() {
        let (router, _store) = app();
        let node = create_node(&router, "pb").await;
        let node_uuid = node["uuid"].clone();
        let cases: Vec<(Value, StatusCode, &str)> = vec![
            (
                json!({"node_uuid": node_uuid}),
                StatusCode::BAD_REQUEST,
                "\"address\"",
            ),
            (
                json!({"address": "zz:zz:zz:zz:zz:zz", "node_uuid": node_uuid}),
                StatusCode::BAD_REQUEST,
                "MAC address",
            ),
            (
                json!({"address": "52:54:00:00:00:01"}),
                StatusCode::BAD_REQUEST,
                "\"node_uuid\"",
            ),
            (
                json!({"address": "52:54:00:00:00:01", "node_uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123"}),
                StatusCode::BAD_REQUEST,
                "could not be found",
            ),
            (
                json!({"address": "52:54:00:00:00:01", "node_uuid": node_uuid, "vendor": "x"}),
                StatusCode::BAD_REQUEST,
                "vendor",
            ),
            (
                json!({"address": "52:54:00:00:00:01", "node_uuid": node_uuid, "pxe_enabled": 3}),
                StatusCode::BAD_REQUEST,
                "\"pxe_enabled\"",
            ),
        ];
        for (body, status, words) in cases {
            let reply = call(&router, Method::POST, "/v1/ports", Some(body)).await;
            assert_fault(&reply, status, words);
        }
        let reply = call(&router, Method::GET, "/v1/ports/not-a-uuid", None).await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "UUID");
    }
}

mod drivers {
    use super::*;

    #[tokio::test]
    async fn drivers_list_show_and_properties() {
        let (router, _store) = app();
        let reply = call(&router, Method::GET, "/v1/drivers", None).await;
        let names: Vec<&str> = reply.json["drivers"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|d| d["name"].as_str())
            .collect();
        assert_eq!(
            names,
            ["agent_ilo", "iscsi_ilo", "pxe_ilo", "ilo", "redfish"]
        );
        assert_eq!(reply.json["drivers"][0]["hosts"], json!([CONDUCTOR]));
        assert_eq!(reply.json["drivers"][0]["type"], "classic");
        let reply = call(&router, Method::GET, "/v1/drivers/?type=dynamic", None).await;
        assert_eq!(reply.json["drivers"].as_array().map(Vec::len), Some(2));
        let reply = call(&router, Method::GET, "/v1/drivers/redfish", None).await;
        assert_eq!(
            reply.json["default_boot_interface"],
            "redfish-virtual-media"
        );
        let reply = call(
            &router,
            Method::GET,
            "/v1/drivers/agent_ilo/properties",
            None,
        )
        .await;
        assert!(reply.json["ilo_address"].is_string());
        let reply = call(&router, Method::GET, "/v1/drivers/pxe_ipmitool", None).await;
        assert_fault(&reply, StatusCode::NOT_FOUND, "pxe_ipmitool");
        let reply = call(&router, Method::GET, "/v1/drivers?type=fancy", None).await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "\"type\"");
        let reply = call_raw(&router, Method::GET, "/v1/drivers", Some("1.29"), None).await;
        assert!(reply.json["drivers"][0].get("type").is_none());
    }
}

mod interfaces {
    use super::*;

    async fn create(router: &axum::Router, body: Value) -> Reply {
        call(router, Method::POST, "/v1/nodes", Some(body)).await
    }

    #[tokio::test]
    async fn drivers_list_every_interface_a_node_may_take_default_first() {
        let (router, _store) = app();
        let reply = call(&router, Method::GET, "/v1/drivers/ilo", None).await;
        assert_eq!(reply.json["default_boot_interface"], "ilo-virtual-media");
        assert_eq!(
            reply.json["enabled_boot_interfaces"],
            json!(["ilo-virtual-media", "ilo-pxe"])
        );
        assert_eq!(
            reply.json["enabled_deploy_interfaces"],
            json!(["direct", "iscsi"])
        );
        let reply = call(&router, Method::GET, "/v1/drivers/agent_ilo", None).await;
        assert_eq!(reply.json["enabled_deploy_interfaces"], json!(["direct"]));
        assert_eq!(reply.json["default_management_interface"], "ilo");
        let reply = call(&router, Method::GET, "/v1/drivers/pxe_ilo", None).await;
        assert_eq!(reply.json["default_boot_interface"], "pxe");
        assert_eq!(reply.json["default_deploy_interface"], "iscsi");
    }

    #[tokio::test]
    async fn node_set_takes_an_offered_interface_and_refuses_one_the_driver_lacks() {
        let (router, store) = app();
        let reply = create(
            &router,
            json!({"driver": "redfish", "name": "rf", "driver_info": {}}),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
        assert_eq!(reply.json["boot_interface"], "redfish-virtual-media");
        assert_eq!(reply.json["deploy_interface"], "direct");
        assert_eq!(reply.json["power_interface"], "redfish");

        let set =
            |value: &str| json!([{"op": "replace", "path": "/deploy_interface", "value": value}]);
        let reply = call(&router, Method::PATCH, "/v1/nodes/rf", Some(set("iscsi"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        assert_eq!(reply.json["deploy_interface"], "iscsi");
        let stored = store
            .node(&NodeIdent::Name("rf".into()))
            .await
            .expect("stored");
        assert_eq!(stored.deploy_interface.as_deref(), Some("iscsi"));

        let reply = call(&router, Method::PATCH, "/v1/nodes/rf", Some(set("ansible"))).await;
        assert_fault(
            &reply,
            StatusCode::BAD_REQUEST,
            "deploy interface implementation 'ansible' is not supported by hardware type redfish",
        );
        let stored = store
            .node(&NodeIdent::Name("rf".into()))
            .await
            .expect("stored");
        assert_eq!(
            stored.deploy_interface.as_deref(),
            Some("iscsi"),
            "nothing lost"
        );

        // Removing the choice goes back to the driver's default.
        let reply = call(
            &router,
            Method::PATCH,
            "/v1/nodes/rf",
            Some(json!([{"op": "remove", "path": "/deploy_interface"}])),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        assert_eq!(reply.json["deploy_interface"], "direct");
        let stored = store
            .node(&NodeIdent::Name("rf".into()))
            .await
            .expect("stored");
        assert_eq!(stored.deploy_interface, None);
    }

    #[tokio::test]
    async fn a_fixed_driver_refuses_another_interface_at_create_and_a_new_driver_resets_them() {
        let (router, store) = app();
        let reply = create(
            &router,
            json!({"driver": "agent_ilo", "deploy_interface": "iscsi", "driver_info": driver_info()}),
        )
        .await;
        assert_fault(
            &reply,
            StatusCode::BAD_REQUEST,
            "'iscsi' is not supported by hardware type agent_ilo",
        );
        let reply = create(
            &router,
            json!({"driver": "ilo", "name": "hw", "boot_interface": "ilo-pxe",
                   "deploy_interface": "iscsi", "driver_info": driver_info()}),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
        assert_eq!(reply.json["boot_interface"], "ilo-pxe");
        // A pair no flow runs is refused.
        let reply = call(
            &router,
            Method::PATCH,
            "/v1/nodes/hw",
            Some(json!([{"op": "replace", "path": "/deploy_interface", "value": "direct"}])),
        )
        .await;
        assert_fault(
            &reply,
            StatusCode::BAD_REQUEST,
            "needs a virtual-media boot",
        );
        // Another driver: the choices that were not patched go back to its defaults.
        let reply = call(
            &router,
            Method::PATCH,
            "/v1/nodes/hw",
            Some(json!([{"op": "replace", "path": "/driver", "value": "iscsi_ilo"}])),
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json);
        assert_eq!(reply.json["boot_interface"], "ilo-virtual-media");
        let stored = store
            .node(&NodeIdent::Name("hw".into()))
            .await
            .expect("stored");
        assert_eq!(
            (stored.boot_interface, stored.deploy_interface),
            (None, None)
        );
        // Before 1.31 the fields do not exist.
        let reply = call_raw(
            &router,
            Method::POST,
            "/v1/nodes",
            Some("1.30"),
            Some(br#"{"driver": "ilo", "deploy_interface": "iscsi"}"#.to_vec()),
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "deploy_interface");
    }
}

mod ramdisk {
    use super::*;

    #[tokio::test]
    async fn call_backs_are_checked_before_the_manager() {
        let (router, _store) = app();
        let reply = call_raw(
            &router,
            Method::GET,
            "/v1/lookup?addresses=52:54:00:00:00:01",
            Some("1.21"),
            None,
        )
        .await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND);
        reply.fault();
        let reply = call(&router, Method::GET, "/v1/lookup", None).await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "node_uuid");
        let reply = call(&router, Method::GET, "/v1/lookup?addresses=lo,none", None).await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "addresses");
        let reply = call(&router, Method::GET, "/v1/lookup?node_uuid=xyz", None).await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "\"node_uuid\"");
        let reply = call_raw(
            &router,
            Method::POST,
            "/v1/heartbeat/1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
            Some("1.62"),
            Some(br#"{"callback_url": "https://10.0.0.5:9999", "agent_status": "start"}"#.to_vec()),
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "agent_status");
        let reply = call(
            &router,
            Method::POST,
            "/v1/heartbeat/1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
            Some(json!({"agent_token": "t"})),
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "callback_url");
        for path in [
            "/v1/nodes/1be26c0b-03f2-4d2e-ae87-c02d7f33c123/vendor_passthru/other",
            "/nodes/1be26c0b-03f2-4d2e-ae87-c02d7f33c123/vendor_passthru?method=other",
        ] {
            let reply = call(&router, Method::POST, path, Some(json!({}))).await;
            assert_fault(&reply, StatusCode::BAD_REQUEST, "other");
        }
        let reply = call(
            &router,
            Method::POST,
            "/nodes/1be26c0b-03f2-4d2e-ae87-c02d7f33c123/vendor_passthru/pass_deploy_info",
            Some(json!([1])),
        )
        .await;
        assert_fault(&reply, StatusCode::BAD_REQUEST, "JSON object");
        // No node exists: each bad body is refused for its field before any node is looked up.
        let cases = [
            (
                json!({"address": 5, "key": "k", "iqn": "iqn-x"}),
                "Invalid pass_deploy_info body: field \"address\": invalid type: integer `5`, \
                 expected a string.",
            ),
            (
                json!({"address": "10.0.2.15", "iqn": "iqn-x"}),
                "Invalid pass_deploy_info body: field \"key\" is required.",
            ),
            (
                json!({"address": "node-1", "key": "k", "iqn": "iqn-x"}),
                "Invalid pass_deploy_info body: field \"address\": \"node-1\" is not an IP \
                 address.",
            ),
        ];
        for (body, message) in cases {
            let reply = call(
                &router,
                Method::POST,
                "/v1/nodes/1be26c0b-03f2-4d2e-ae87-c02d7f33c123/vendor_passthru/pass_deploy_info",
                Some(body),
            )
            .await;
            assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.json);
            assert_eq!(reply.fault(), message);
        }
        let reply = call(
            &router,
            Method::POST,
            "/v1/heartbeat/1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
            Some(json!({"callback_url": "https://10.0.0.5:9999", "agent_version": ["10"]})),
        )
        .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.json);
        assert_eq!(
            reply.fault(),
            "Invalid heartbeat body: field \"agent_version\": invalid type: sequence, expected a \
             string."
        );
    }
}

/// The call-backs' failed checks, counted per client address and per node
/// (`crate::net::failed_checks`), through the router as the listener feeds it.
mod failed_checks {
    use std::net::IpAddr;

    use super::*;
    use crate::api::test_support::{app_with, call_from, TestStore};
    use crate::api::ApiOptions;
    use crate::net::failed_checks::FailureLimits;
    use crate::states::ProvisionState;
    use crate::store::Node;

    const TOKEN: &str = "the-right-agent-token-of-43-characters-xxxx";
    const KEY: &str = "the-right-deploy-key";

    fn limits(per_client: u32, per_node: u32) -> ApiOptions {
        ApiOptions {
            callback_failures: FailureLimits {
                per_client,
                per_node,
            },
            ..ApiOptions::default()
        }
    }

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + n))
    }

    /// A node of `driver` in `state` that holds the agent token and the deploy key.
    async fn node_with_secrets(
        router: &axum::Router,
        store: &TestStore,
        name: &str,
        driver: &str,
        state: ProvisionState,
    ) -> Node {
        let reply = call(
            router,
            Method::POST,
            "/v1/nodes",
            Some(json!({"driver": driver, "name": name, "driver_info": driver_info()})),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.json);
        let mut node = store
            .node(&NodeIdent::Name(name.into()))
            .await
            .expect("created");
        node.provision_state = state;
        node.driver_internal_info
            .insert("agent_secret_token".into(), json!(TOKEN));
        node.driver_internal_info
            .insert("deployment_key".into(), json!(KEY));
        store.update_node(&node).await.expect("arranged");
        store.node(&NodeIdent::Uuid(node.uuid)).await.expect("read")
    }

    fn heartbeat(token: &str) -> Option<Value> {
        Some(json!({"callback_url": "https://10.0.0.5:9999", "agent_token": token}))
    }

    fn retry_after(reply: &Reply) -> u64 {
        reply
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no Retry-After: {:?}", reply.headers))
    }

    /// One address guessing tokens is stopped after its share (404s for unknown nodes count
    /// too), for every call-back and before any check; another address is not, and the node's
    /// own agent's heartbeat is taken.
    #[tokio::test]
    async fn a_guessing_address_gets_429_and_others_are_served() {
        let (router, store) = app_with(limits(5, 1000));
        let node = node_with_secrets(
            &router,
            &store,
            "n1",
            "agent_ilo",
            ProvisionState::Deploying,
        )
        .await;
        let path = format!("/v1/heartbeat/{}", node.uuid);
        let attacker = ip(66);
        for n in 0..4 {
            let reply = call_from(
                &router,
                attacker,
                Method::POST,
                &path,
                heartbeat(&format!("guess-{n}")),
            )
            .await;
            assert_fault(&reply, StatusCode::FORBIDDEN, "agent token");
        }
        let unknown = "/v1/heartbeat/1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
        let reply = call_from(&router, attacker, Method::POST, unknown, heartbeat(TOKEN)).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.json);
        // Its share is used up: 429 whatever it sends, the right token included, and on every
        // call-back, before the body is even parsed.
        for (method, path, body) in [
            (Method::POST, path.as_str(), heartbeat("guess")),
            (Method::POST, path.as_str(), heartbeat(TOKEN)),
            (Method::POST, path.as_str(), Some(json!("not a heartbeat"))),
            (
                Method::GET,
                "/v1/lookup?node_uuid=1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
                None,
            ),
            (
                Method::POST,
                "/v1/nodes/n1/vendor_passthru/pass_deploy_info",
                Some(json!({"address": "10.0.2.15", "key": "k", "iqn": "iqn-x"})),
            ),
        ] {
            let reply = call_from(&router, attacker, method.clone(), path, body).await;
            assert_fault(&reply, StatusCode::TOO_MANY_REQUESTS, "retry after");
            let wait = retry_after(&reply);
            assert!(
                (1..=12).contains(&wait),
                "5 a minute: one in 12 s, got {wait}"
            );
        }
        let reply = call_from(&router, ip(7), Method::POST, &path, heartbeat(TOKEN)).await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.json);
        let reply = call_from(&router, ip(8), Method::POST, &path, heartbeat("wrong")).await;
        assert_fault(&reply, StatusCode::FORBIDDEN, "agent token");
    }

    /// Wrong tokens for one node from many addresses (a few each, under the address limit):
    /// past the node's share they get 429, but the right token's heartbeat is taken all along.
    #[tokio::test]
    async fn a_storm_against_a_node_does_not_keep_its_agent_out() {
        let (router, store) = app_with(limits(3, 10));
        let node = node_with_secrets(
            &router,
            &store,
            "n1",
            "agent_ilo",
            ProvisionState::Deploying,
        )
        .await;
        let other = node_with_secrets(
            &router,
            &store,
            "n2",
            "agent_ilo",
            ProvisionState::Deploying,
        )
        .await;
        let path = format!("/v1/heartbeat/{}", node.uuid);
        let mut statuses = Vec::new();
        for n in 0..60u32 {
            let reply = call_from(
                &router,
                ip(1000 + n / 2),
                Method::POST,
                &path,
                heartbeat("guess"),
            )
            .await;
            statuses.push(reply.status);
            if reply.status == StatusCode::TOO_MANY_REQUESTS {
                assert!(
                    reply.fault().contains(&node.uuid.to_string()),
                    "{}",
                    reply.json
                );
                assert!(retry_after(&reply) >= 1);
            }
            if n % 10 == 9 {
                let reply = call_from(&router, ip(1), Method::POST, &path, heartbeat(TOKEN)).await;
                assert_eq!(
                    reply.status,
                    StatusCode::ACCEPTED,
                    "the agent's heartbeat after {n} guesses"
                );
            }
        }
        let forbidden = statuses
            .iter()
            .filter(|s| **s == StatusCode::FORBIDDEN)
            .count();
        let throttled = statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count();
        assert_eq!((forbidden, throttled), (10, 50), "{statuses:?}");
        // Another node is not throttled by it.
        let path = format!("/v1/heartbeat/{}", other.uuid);
        let reply = call_from(&router, ip(2), Method::POST, &path, heartbeat("wrong")).await;
        assert_fault(&reply, StatusCode::FORBIDDEN, "agent token");
    }

    /// A refused or throttled call-back writes nothing: the node record stays as it was, every
    /// field (`updated_at` included, so not even a write of the same values happened).
    #[tokio::test]
    async fn failed_and_throttled_checks_change_nothing_in_the_store() {
        let (router, store) = app_with(limits(4, 6));
        let agent = node_with_secrets(
            &router,
            &store,
            "a1",
            "agent_ilo",
            ProvisionState::WaitCallBack,
        )
        .await;
        let iscsi = node_with_secrets(
            &router,
            &store,
            "i1",
            "iscsi_ilo",
            ProvisionState::WaitCallBack,
        )
        .await;
        let heartbeat_path = format!("/v1/heartbeat/{}", agent.uuid);
        let passthru_paths = [
            format!("/v1/nodes/{}/vendor_passthru/pass_deploy_info", iscsi.uuid),
            format!(
                "/nodes/{}/vendor_passthru?method=pass_deploy_info",
                iscsi.uuid
            ),
        ];
        let mut statuses = Vec::new();
        for n in 0..24u32 {
            let client = ip(2000 + n / 3);
            let reply = call_from(
                &router,
                client,
                Method::POST,
                &heartbeat_path,
                heartbeat(""),
            )
            .await;
            statuses.push(reply.status);
            let body = json!({"address": "10.0.2.15", "key": format!("guess-{n}"), "iqn": "iqn.2008-10.org.openstack:x"});
            let path = &passthru_paths[n as usize % 2];
            let reply = call_from(&router, client, Method::POST, path, Some(body)).await;
            statuses.push(reply.status);
        }
        assert!(statuses.contains(&StatusCode::FORBIDDEN), "{statuses:?}");
        assert!(
            statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
            "{statuses:?}"
        );
        assert!(
            statuses
                .iter()
                .all(|s| *s == StatusCode::FORBIDDEN || *s == StatusCode::TOO_MANY_REQUESTS),
            "{statuses:?}"
        );
        for before in [agent, iscsi] {
            let after = store
                .node(&NodeIdent::Uuid(before.uuid))
                .await
                .expect("read");
            assert_eq!(
                format!("{after:?}"),
                format!("{before:?}"),
                "node {}",
                before.uuid
            );
            assert!(!after
                .driver_internal_info
                .contains_key("agent_last_heartbeat"));
            assert_eq!(after.reservation, None);
            assert_eq!(after.last_error, None);
            assert_eq!(after.provision_state, ProvisionState::WaitCallBack);
        }
    }
}

/// Generated bodies and patches at the write endpoints: always a 2xx or 4xx with a well-formed
/// fault body on 4xx, never a 5xx or a panic.
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            "[a-z_ :/.-]{0,12}".prop_map(Value::String),
            prop_oneof![
                Just("agent_ilo"),
                Just("redfish"),
                Just("power on"),
                Just("active"),
                Just("manage"),
                Just("52:54:00:12:34:56"),
                Just("1be26c0b-03f2-4d2e-ae87-c02d7f33c123"),
            ]
            .prop_map(|s| Value::String(s.into())),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("driver".to_string()),
                        Just("driver_info".to_string()),
                        Just("name".to_string()),
                        Just("uuid".to_string()),
                        Just("address".to_string()),
                        Just("node_uuid".to_string()),
                        Just("extra".to_string()),
                        Just("target".to_string()),
                        Just("instance_info".to_string()),
                        Just("maintenance".to_string()),
                        "[a-z_]{1,8}",
                    ],
                    inner,
                    0..5,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn patch_op() -> impl Strategy<Value = Value> {
        (
            prop_oneof![
                Just("add".to_string()),
                Just("replace".to_string()),
                Just("remove".to_string()),
                Just("move".to_string()),
                "[a-z]{0,6}",
            ],
            prop_oneof![
                Just("/driver".to_string()),
                Just("/name".to_string()),
                Just("/maintenance".to_string()),
                Just("/address".to_string()),
                Just("/node_uuid".to_string()),
                Just("/pxe_enabled".to_string()),
                Just("/instance_uuid".to_string()),
                Just("/provision_state".to_string()),
                "(/(driver_info|instance_info|extra|properties|[a-z_]{1,6}|[0-9]|-)){1,4}",
                "[/a-z ~]{0,10}",
            ],
            json_value(),
            any::<bool>(),
        )
            .prop_map(|(op, path, value, with_value)| {
                let mut o = json!({"op": op, "path": path});
                if with_value {
                    o["value"] = value;
                }
                o
            })
    }

    fn check(reply: &Reply, what: &str) {
        assert!(
            reply.status.is_success() || reply.status.is_client_error(),
            "{what}: {} {}",
            reply.status,
            reply.json
        );
        if reply.status.is_client_error() {
            reply.fault();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

        #[test]
        fn write_endpoints_stay_up(
            body in json_value(),
            raw in prop::collection::vec(any::<u8>(), 0..64),
            patch in prop::collection::vec(patch_op(), 0..5),
        ) {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async {
                let (router, _store) = app();
                let node = create_node(&router, "fz").await;
                let uuid = node["uuid"].as_str().expect("uuid").to_string();
                let reply = call(&router, Method::POST, "/v1/ports", Some(json!({"address": "52:54:00:00:00:aa", "node_uuid": uuid}))).await;
                let port = reply.json["uuid"].as_str().expect("port uuid").to_string();
                let writes = [
                    (Method::POST, "/v1/nodes".to_string()),
                    (Method::POST, "/v1/ports".to_string()),
                    (Method::PATCH, format!("/v1/nodes/{uuid}")),
                    (Method::PATCH, format!("/v1/ports/{port}")),
                    (Method::PUT, "/v1/nodes/fz/management/boot_device".to_string()),
                ];
                for (method, path) in writes.iter() {
                    let reply = call(&router, method.clone(), path, Some(body.clone())).await;
                    check(&reply, &format!("{method} {path} {body}"));
                    let reply = call_raw(&router, method.clone(), path, Some("latest"), Some(raw.clone())).await;
                    check(&reply, &format!("{method} {path} raw {raw:?}"));
                }
                for path in [format!("/v1/nodes/{uuid}"), format!("/v1/ports/{port}")] {
                    let reply = call(&router, Method::PATCH, &path, Some(Value::Array(patch.clone()))).await;
                    check(&reply, &format!("PATCH {path} {patch:?}"));
                }
                // The states endpoints refuse what they cannot parse before the manager runs.
                for path in ["/v1/nodes/fz/states/power", "/v1/nodes/fz/states/provision"] {
                    let reply = call(&router, Method::PUT, path, Some(body.clone())).await;
                    let reached_manager = reply.status.is_server_error()
                        && body.get("target").is_some_and(Value::is_string);
                    if !reached_manager {
                        check(&reply, &format!("PUT {path} {body}"));
                    }
                }
            });
        }
    }
}
