//! The embedded store: SQLite in the state directory (to be written: issue 10, store helper).
