//! The column lists of the `nodes` and `ports` tables, one for both stores: their schemas name
//! the same columns, and every statement selects or writes them in this order.

/// The node columns every read selects, in the order each store's `node_from_row` reads them.
pub(in crate::store) const NODE_COLUMNS: &str =
    "uuid, name, driver, driver_info, driver_internal_info, \
     properties, instance_info, extra, network_data, instance_uuid, provision_state, \
     target_provision_state, provision_updated_at, power_state, target_power_state, maintenance, \
     maintenance_reason, last_error, reservation, console_enabled, created_at, updated_at, \
     boot_interface, deploy_interface, conductor_group";

/// The port columns every read selects, in the order each store's `port_from_row` reads them.
pub(in crate::store) const PORT_COLUMNS: &str =
    "uuid, address, node_uuid, pxe_enabled, extra, created_at, updated_at";

/// The columns each store's `node_values` fills, in its order: every field but `reservation`,
/// `created_at` and `updated_at`, which only their own statements write.
pub(in crate::store) const NODE_WRITABLE: [&str; 22] = [
    "name",
    "driver",
    "driver_info",
    "driver_internal_info",
    "properties",
    "instance_info",
    "extra",
    "network_data",
    "instance_uuid",
    "provision_state",
    "target_provision_state",
    "provision_updated_at",
    "power_state",
    "target_power_state",
    "maintenance",
    "maintenance_reason",
    "last_error",
    "console_enabled",
    "boot_interface",
    "deploy_interface",
    "conductor_group",
    "uuid",
];
