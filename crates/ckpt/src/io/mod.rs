//! Bytes in and out: the input file (positioned reads), storage bytes,
//! atomic output files, and fast copies between them.

pub(crate) mod atomic;
pub(crate) mod bulk_copy;
pub(crate) mod source;
pub(crate) mod storage;
