//! fat (foundation)
