//! Least privilege and authentication, checked on every local run as AWS checks them: what
//! each function may do, and who may call what.
//!
//! - [`policy`]: each function's permissions from the template, what each AWS request needs,
//!   and IAM's verdict.
//! - [`sigv4`], [`jwt`]: the HTTP API's and function URLs' authorizers.
//! - [`callers`]: which routes a signed caller's managed policy allows.
//! - [`issuer`]: an OpenID Connect issuer on loopback, where a JWT stack's console signs in.

pub mod callers;
pub mod issuer;
pub mod jwt;
pub mod policy;
pub mod sigv4;
