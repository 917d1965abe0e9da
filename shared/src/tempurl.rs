//! tempurl (foundation)
