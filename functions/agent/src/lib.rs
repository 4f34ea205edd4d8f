//! The HTTP agent: [`sas_agent_kit`]'s agent on a service reached over HTTP
//! ([`sas_aws::http::HttpRemote`]); this crate adds only where the service is and how calls
//! to it authenticate ([`settings`]).

pub mod settings;
