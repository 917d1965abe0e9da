//! params (foundation)
