//! iSCSI PDU codec (RFC 7143), shared by the agent's target and the conductor's initiator.
