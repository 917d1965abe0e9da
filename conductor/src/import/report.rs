//! The report of an import, as text (one block per node, then a summary line) or as one JSON
//! object. It names keys, never values: a `driver_info` value may be a secret.

use serde_json::{json, Value};

use super::apply::NodeResult;
use super::mapping::{Decision, NodePlan, Plan, TakeOver};

/// What an import did or would do.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    /// Where the nodes came from (a URL or a file).
    pub source: &'a str,
    /// The vmdeploy API.
    pub target: &'a str,
    /// The plan.
    pub plan: &'a Plan,
    /// With `--apply`, one result per plan node.
    pub results: Option<&'a [Option<NodeResult>]>,
}

/// The counts of the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Nodes read.
    pub nodes: usize,
    /// Taken over.
    pub taken_over: usize,
    /// Of those, planned to end `manageable`.
    pub to_manageable: usize,
    /// Of those, planned to stay `enroll`.
    pub to_enroll: usize,
    /// Not taken over.
    pub not_taken_over: usize,
    /// Ports planned.
    pub ports: usize,
    /// With `--apply`: enrolled.
    pub enrolled: usize,
    /// With `--apply`: `manageable` at the end.
    pub manageable: usize,
    /// With `--apply`: nodes with a failure.
    pub failed: usize,
}

fn or_dash(s: Option<&str>) -> &str {
    s.unwrap_or("-")
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "-".into()
    } else {
        items.join(", ")
    }
}

/// `redfish (redfish-virtual-media/direct)`, or the driver alone when it has one pair.
fn our_driver(t: &TakeOver) -> String {
    match (t.boot_interface, t.deploy_interface) {
        (None, None) => t.driver.to_string(),
        (boot, deploy) => format!(
            "{} ({}/{})",
            t.driver,
            boot.unwrap_or("default"),
            deploy.unwrap_or("default")
        ),
    }
}

impl Report<'_> {
    fn result(&self, i: usize) -> Option<&NodeResult> {
        self.results.and_then(|r| r.get(i)).and_then(Option::as_ref)
    }

    /// The summary's counts.
    pub fn counts(&self) -> Counts {
        let mut c = Counts {
            nodes: self.plan.nodes.len(),
            ..Counts::default()
        };
        for (i, node) in self.plan.nodes.iter().enumerate() {
            match node.take_over() {
                Some(t) => {
                    c.taken_over += 1;
                    c.ports += t.ports.len();
                    if t.stays_enroll.is_empty() {
                        c.to_manageable += 1;
                    } else {
                        c.to_enroll += 1;
                    }
                }
                None => c.not_taken_over += 1,
            }
            if let Some(r) = self.result(i) {
                c.enrolled += usize::from(r.enrolled);
                c.manageable += usize::from(r.provision_state.as_deref() == Some("manageable"));
                c.failed += usize::from(r.failed());
            }
        }
        c
    }

    /// The text report.
    pub fn text(&self) -> String {
        let mut out = format!(
            "import from {} into {} ({})\n",
            self.source,
            self.target,
            if self.results.is_some() {
                "--apply"
            } else {
                "dry run"
            }
        );
        for (i, node) in self.plan.nodes.iter().enumerate() {
            out.push_str(&self.node_text(i, node));
        }
        if !self.plan.orphan_ports.is_empty() {
            out.push_str(&format!(
                "ports of no listed node, not imported: {}\n",
                self.plan.orphan_ports.join(", ")
            ));
        }
        let c = self.counts();
        out.push_str(&format!(
            "summary: {} nodes: {} taken over ({} to end manageable, {} to stay enroll), {} not \
             taken over; {} ports",
            c.nodes, c.taken_over, c.to_manageable, c.to_enroll, c.not_taken_over, c.ports
        ));
        if !self.plan.ports_known {
            out.push_str(" (no ports file given)");
        }
        if self.results.is_some() {
            out.push_str(&format!(
                "; applied: {} enrolled, {} manageable, {} failed\n",
                c.enrolled, c.manageable, c.failed
            ));
        } else {
            out.push_str("; dry run: nothing changed, run again with --apply to enroll\n");
        }
        if c.taken_over > 0 {
            out.push_str(
                "next: the source Ironic still manages these nodes: set maintenance on them \
                 there (`baremetal node maintenance set`) before vmdeploy deploys them, then \
                 delete them from it (docs/import.md)\n",
            );
        }
        out
    }

    fn node_text(&self, i: usize, node: &NodePlan) -> String {
        let s = &node.source;
        let head = format!(
            "{} {}: {}/{}/{} ({})",
            or_dash(node.uuid.as_deref()),
            or_dash(node.name.as_deref()),
            or_dash(s.driver.as_deref()),
            or_dash(s.boot_interface.as_deref()),
            or_dash(s.deploy_interface.as_deref()),
            or_dash(s.provision_state.as_deref()),
        );
        let t = match &node.decision {
            Decision::Skip(reason) => return format!("{head} -> - | not taken over: {reason}\n"),
            Decision::TakeOver(t) => t,
        };
        let mut out = format!(
            "{head} -> {} | carries: {} | dropped: {} | ends: {}\n",
            our_driver(t),
            list(&t.carries),
            list(&t.dropped),
            t.ends()
        );
        for note in &t.notes {
            out.push_str(&format!("    note: {note}\n"));
        }
        for why in &t.stays_enroll {
            out.push_str(&format!("    stays enroll: {why}\n"));
        }
        if let Some(r) = self.result(i) {
            if r.enrolled {
                out.push_str(&format!(
                    "    applied: enrolled, {} of {} ports, {}\n",
                    r.ports,
                    t.ports.len(),
                    or_dash(r.provision_state.as_deref())
                ));
            }
            for error in &r.errors {
                out.push_str(&format!("    FAILED: {error}\n"));
            }
        }
        out
    }

    /// The JSON report.
    pub fn json(&self) -> Value {
        let nodes: Vec<Value> = self
            .plan
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let s = &node.source;
                let mut v = json!({
                    "uuid": node.uuid,
                    "name": node.name,
                    "source": {
                        "driver": s.driver,
                        "boot_interface": s.boot_interface,
                        "deploy_interface": s.deploy_interface,
                        "provision_state": s.provision_state,
                    },
                });
                let fields = match &node.decision {
                    Decision::Skip(reason) => json!({
                        "taken_over": false,
                        "not_taken_over": reason,
                    }),
                    Decision::TakeOver(t) => json!({
                        "taken_over": true,
                        "driver": t.driver,
                        "boot_interface": t.boot_interface,
                        "deploy_interface": t.deploy_interface,
                        "carries": t.carries,
                        "dropped": t.dropped,
                        "notes": t.notes,
                        "stays_enroll": t.stays_enroll,
                        "ends": t.ends(),
                        "ports": t.ports.iter().map(|p| json!({
                            "address": p.address, "pxe_enabled": p.pxe_enabled,
                        })).collect::<Vec<_>>(),
                    }),
                };
                if let (Some(obj), Value::Object(more)) = (v.as_object_mut(), fields) {
                    obj.extend(more);
                }
                if let (Some(obj), Some(r)) = (v.as_object_mut(), self.result(i)) {
                    obj.insert(
                        "result".into(),
                        json!({
                            "enrolled": r.enrolled,
                            "ports": r.ports,
                            "provision_state": r.provision_state,
                            "errors": r.errors,
                        }),
                    );
                }
                v
            })
            .collect();
        let c = self.counts();
        let mut summary = json!({
            "nodes": c.nodes,
            "taken_over": c.taken_over,
            "to_manageable": c.to_manageable,
            "to_enroll": c.to_enroll,
            "not_taken_over": c.not_taken_over,
            "ports": c.ports,
        });
        if let (Some(obj), true) = (summary.as_object_mut(), self.results.is_some()) {
            obj.insert("enrolled".into(), json!(c.enrolled));
            obj.insert("manageable".into(), json!(c.manageable));
            obj.insert("failed".into(), json!(c.failed));
        }
        json!({
            "source": self.source,
            "target": self.target,
            "applied": self.results.is_some(),
            "ports_known": self.plan.ports_known,
            "nodes": nodes,
            "orphan_ports": self.plan.orphan_ports,
            "summary": summary,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::mapping::{plan, Existing};
    use crate::import::source::SourceNode;

    const U1: &str = "6f1d0b52-3a4e-4c8b-9d7a-1e2f3a4b5c6d";
    const U2: &str = "0c9e8d7f-6a5b-4c3d-8e2f-1a0b9c8d7e6f";

    fn sample() -> Plan {
        let nodes = [
            json!({
                "uuid": U1, "name": "gen9-1", "driver": "ilo",
                "boot_interface": "ilo-virtual-media", "deploy_interface": "iscsi",
                "provision_state": "manageable",
                "driver_info": {"ilo_address": "10.0.0.1", "ilo_username": "u",
                                "ilo_password": "s3cret-value", "snmp_auth_user": "x"},
            }),
            json!({
                "uuid": U2, "name": "gen10-1", "driver": "ilo5",
                "boot_interface": "ilo-virtual-media", "deploy_interface": "direct",
                "provision_state": "active",
            }),
        ];
        let nodes: Vec<SourceNode> = nodes.iter().map(SourceNode::from_json).collect();
        plan(&nodes, None, &Existing::default())
    }

    #[test]
    fn one_line_per_node_and_a_summary() {
        let plan = sample();
        let report = Report {
            source: "nodes.json",
            target: "http://127.0.0.1:6385",
            plan: &plan,
            results: None,
        };
        let text = report.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "import from nodes.json into http://127.0.0.1:6385 (dry run)"
        );
        assert!(lines[1].starts_with(&format!(
            "{U1} gen9-1: ilo/ilo-virtual-media/iscsi (manageable) -> iscsi_ilo | carries: \
             name, driver_info (ilo_address, ilo_password, ilo_username) | dropped: \
             driver_info.snmp_auth_user | ends: manageable"
        )));
        assert!(text.contains(&format!(
            "{U2} gen10-1: ilo5/ilo-virtual-media/direct (active) -> - | not taken over: in use \
             (active)\n"
        )));
        assert!(text.contains(
            "summary: 2 nodes: 1 taken over (1 to end manageable, 0 to stay enroll), 1 not \
             taken over; 0 ports (no ports file given); dry run: nothing changed"
        ));
        assert!(!text.contains("s3cret-value"), "{text}");
        let json = report.json();
        assert!(!json.to_string().contains("s3cret-value"));
        assert_eq!(json["nodes"][0]["driver"], "iscsi_ilo");
        assert_eq!(json["nodes"][0]["ends"], "manageable");
        assert_eq!(json["nodes"][1]["not_taken_over"], "in use (active)");
        assert_eq!(json["summary"]["taken_over"], 1);
        assert_eq!(json["applied"], false);
    }

    #[test]
    fn results_are_shown_and_counted() {
        let plan = sample();
        let results = vec![
            Some(NodeResult {
                enrolled: true,
                ports: 0,
                provision_state: Some("enroll".into()),
                errors: vec!["manage failed: no BMC".into()],
            }),
            None,
        ];
        let report = Report {
            source: "s",
            target: "t",
            plan: &plan,
            results: Some(&results),
        };
        let text = report.text();
        assert!(
            text.contains("    applied: enrolled, 0 of 0 ports, enroll\n"),
            "{text}"
        );
        assert!(
            text.contains("    FAILED: manage failed: no BMC\n"),
            "{text}"
        );
        assert!(
            text.contains("applied: 1 enrolled, 0 manageable, 1 failed"),
            "{text}"
        );
        let c = report.counts();
        assert_eq!((c.enrolled, c.manageable, c.failed), (1, 0, 1));
        assert_eq!(report.json()["summary"]["failed"], 1);
        assert_eq!(
            report.json()["nodes"][0]["result"]["errors"][0],
            "manage failed: no BMC"
        );
    }
}
