//! api (foundation)
