//! Shared helpers for vmdeploy's integration tests: locating the built binaries and starting real
//! peers (tgtd, Swift, sushy-tools, proliantutils) on loopback.
