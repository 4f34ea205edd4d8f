//! The ledger agent: an agent written in Rust on the agent kit, which calls AWS services
//! through the AWS SDK instead of an HTTP service. It opens and closes the accounts of the
//! account-opening workflow in a DynamoDB table of its own, and keeps a statement of each
//! account in an S3 bucket, both named after the stack's id (`ledger-accounts-<stack id>` and
//! `ledger-<stack id>`, from `STACK_ID`): a delete keeps them, and a stack created again under
//! the same name has another id. Its role may write there and nowhere else.

mod ledger;

use lambda_runtime::Error;
use sas_aws::settings::Env;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let env = Env::process();
    let stack_id = env.required("STACK_ID")?;
    sas_agent_kit::run(async |wiring, _| {
        let sdk = wiring.sdk();
        // An endpoint of one's own (the local stack, LocalStack) serves buckets by path:
        // `<endpoint>/<bucket>/<key>`, not `<bucket>.<endpoint>`.
        let s3 = aws_sdk_s3::config::Builder::from(sdk)
            .force_path_style(sdk.endpoint_url().is_some())
            .build();
        Ok(ledger::Ledger {
            accounts: wiring.dynamodb().clone(),
            table: format!("ledger-accounts-{stack_id}"),
            statements: aws_sdk_s3::Client::from_conf(s3),
            bucket: format!("ledger-{stack_id}"),
        })
    })
    .await
}
