//! `vmdeploy-conductor serve`: configuration, listeners, TLS, auth, logging, and the drain on
//! SIGTERM (STYLE.md §7, after linkerd2-proxy's main).
