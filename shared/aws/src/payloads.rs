//! The payload store on S3: one object per stored value, under `orders/<order id>/`, named by
//! its digest, in a bucket encrypted at rest whose lifecycle deletes them after the retention.
//!
//! A deployment without a bucket (`PAYLOAD_BUCKET` unset) stores nothing: values are carried
//! inline up to a message's size, as [`sas_engine::payload::NoPayloads`] does.

use aws_sdk_s3::primitives::ByteStream;
use sas_engine::ports::Payloads;
use sas_engine::{Error, Result};

use crate::errors::classify;

/// Large inputs and outputs in an S3 bucket.
#[derive(Clone, Debug)]
pub struct S3Payloads {
    client: aws_sdk_s3::Client,
    bucket: Option<String>,
}

impl S3Payloads {
    /// The store in `bucket`, or none if there is no bucket.
    pub fn new(client: aws_sdk_s3::Client, bucket: Option<String>) -> Self {
        S3Payloads { client, bucket: bucket.filter(|b| !b.is_empty()) }
    }

    fn bucket(&self) -> Result<&str> {
        self.bucket.as_deref().ok_or_else(|| {
            Error::Config("PAYLOAD_BUCKET is not set: no value can be stored".into())
        })
    }
}

impl Payloads for S3Payloads {
    fn stores(&self) -> bool {
        self.bucket.is_some()
    }

    async fn put(&self, key: &str, body: Vec<u8>) -> Result<()> {
        self.client
            .put_object()
            .bucket(self.bucket()?)
            .key(key)
            .content_type("application/json")
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| classify("S3", e))?;
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let answer = self.client.get_object().bucket(self.bucket()?).key(key).send().await;
        let object = match answer {
            Ok(object) => object,
            Err(e) if e.as_service_error().is_some_and(|e| e.is_no_such_key()) => return Ok(None),
            Err(e) => return Err(classify("S3", e)),
        };
        let body = object.body.collect().await.map_err(|e| Error::unavailable("S3", e))?;
        Ok(Some(body.into_bytes().to_vec()))
    }
}
