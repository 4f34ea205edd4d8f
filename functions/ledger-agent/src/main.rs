//! The ledger agent: an agent written in Rust on the agent kit, which calls an AWS service
//! through the AWS SDK instead of an HTTP service. It opens and closes the accounts of the
//! account-opening workflow in a DynamoDB table of its own, named after the stack
//! (`<stack>-ledger-accounts`, from `STACK_NAME`), on which its role may write and nothing else.

mod ledger;

use lambda_runtime::Error;
use sas_aws::settings::Env;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let stack = Env::process().required("STACK_NAME")?;
    sas_agent_kit::run(async |wiring, _| {
        Ok(ledger::Ledger::new(wiring.dynamodb().clone(), format!("{stack}-ledger-accounts")))
    })
    .await
}
