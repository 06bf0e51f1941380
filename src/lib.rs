pub use pmstate_norm as norm;
