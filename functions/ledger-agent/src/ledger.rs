//! Accounts in a DynamoDB table, one item per order: `open-account` creates it, open, with the
//! holder and plan of the order's input; `close-account` (the undo) marks it closed. Each then
//! writes the account's statement, `statements/<account>.json` in the ledger's S3 bucket, as
//! the account now stands. Both are idempotent on the step's key, as every agent's actions must
//! be: a call repeated after a lost answer finds its own effect and answers the same (the
//! statement is written again, whole, with the same content). A failed SDK call is reported as
//! the kit classifies it ([`sdk_fault`]): throttling, a 5xx or a timeout passes and is tried
//! again; an access denied or any other refusal fails the step with its cause, at once.

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue};
use sas_agent_kit::{RemoteCall, RemoteFault, RemoteService, sdk_fault};
use serde_json::{Value, json};

/// Largest first deposit the ledger takes, in minor units: above it, opening is refused.
pub const MAX_DEPOSIT: i64 = 100_000_000;

/// The ledger's two stores, by the names the stack gives them.
pub struct Ledger {
    pub accounts: Client,
    pub table: String,
    pub statements: aws_sdk_s3::Client,
    pub bucket: String,
}

impl Ledger {
    /// Writes `account`'s statement, whole: the same call again writes the same object.
    async fn statement(&self, account: &str, statement: &Value) -> Result<(), RemoteFault> {
        self.statements
            .put_object()
            .bucket(&self.bucket)
            .key(format!("statements/{account}.json"))
            .content_type("application/json")
            .body(statement.to_string().into_bytes().into())
            .send()
            .await
            .map(|_| ())
            .map_err(|e| sdk_fault("S3", e))
    }

    async fn open(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        let input = call.order.input();
        let holder = input["customer"]["name"].as_str().unwrap_or_default();
        let deposit = input["initial_deposit"].as_i64().unwrap_or(0);
        if deposit > MAX_DEPOSIT {
            return Err(RemoteFault::Permanent(format!(
                "a first deposit above {MAX_DEPOSIT} needs a branch"
            )));
        }
        let account = account_number(&call.order_id.to_string());
        let put = self
            .accounts
            .put_item()
            .table_name(&self.table)
            .item("AccountId", AttributeValue::S(account.clone()))
            .item("StepKey", AttributeValue::S(call.idempotency_key.clone()))
            .item("Holder", AttributeValue::S(holder.to_owned()))
            .item("Plan", AttributeValue::S(input["plan"].as_str().unwrap_or("basic").to_owned()))
            .item("Balance", AttributeValue::N(deposit.to_string()))
            .item("Status", AttributeValue::S("open".into()))
            // Opened once per key: the same call again finds its own account.
            .condition_expression("attribute_not_exists(AccountId) OR StepKey = :key")
            .expression_attribute_values(":key", AttributeValue::S(call.idempotency_key.clone()))
            .send()
            .await;
        match put {
            Ok(_) => {}
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => {
                return Err(RemoteFault::Permanent(format!(
                    "account {account} was opened by another call"
                )));
            }
            Err(e) => return Err(sdk_fault("DynamoDB", e)),
        }
        let statement = json!({
            "account_id": account,
            "order_id": call.order_id.to_string(),
            "holder": holder,
            "plan": input["plan"].as_str().unwrap_or("basic"),
            "balance": deposit,
            "status": "open",
        });
        self.statement(&account, &statement).await?;
        Ok(json!({ "account_id": account }))
    }

    async fn close(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        // The account the step opened, from its output; an account never opened is closed.
        let Some(account) = call.input.as_ref().and_then(|o| o["account_id"].as_str()) else {
            return Ok(json!({ "closed": false }));
        };
        let update = self
            .accounts
            .update_item()
            .table_name(&self.table)
            .key("AccountId", AttributeValue::S(account.to_owned()))
            .update_expression("SET #s = :closed, CloseKey = :key")
            .condition_expression("attribute_exists(AccountId)")
            .expression_attribute_names("#s", "Status")
            .expression_attribute_values(":closed", AttributeValue::S("closed".into()))
            .expression_attribute_values(":key", AttributeValue::S(call.idempotency_key.clone()))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        let closed = match update {
            Ok(closed) => closed.attributes.unwrap_or_default(),
            Err(e) if e.code() == Some("ConditionalCheckFailedException") => {
                return Ok(json!({ "closed": false, "account_id": account }));
            }
            Err(e) => return Err(sdk_fault("DynamoDB", e)),
        };
        let text = |name: &str| match closed.get(name) {
            Some(AttributeValue::S(s) | AttributeValue::N(s)) => Value::String(s.clone()),
            _ => Value::Null,
        };
        let statement = json!({
            "account_id": account,
            "order_id": call.order_id.to_string(),
            "holder": text("Holder"),
            "plan": text("Plan"),
            "balance": text("Balance").as_str().and_then(|b| b.parse::<i64>().ok()),
            "status": "closed",
        });
        self.statement(account, &statement).await?;
        Ok(json!({ "closed": true, "account_id": account }))
    }
}

impl RemoteService for Ledger {
    async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
        match call.action.as_str() {
            "open-account" => self.open(call).await,
            "close-account" => self.close(call).await,
            other => Err(RemoteFault::Permanent(format!("the ledger has no action {other}"))),
        }
    }
}

/// An account number a person can read back, fixed by the order: a retry opens the same one.
fn account_number(order_id: &str) -> String {
    let digits: String = order_id.chars().filter(char::is_ascii_hexdigit).take(12).collect();
    format!("ACC-{}", digits.to_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_number_is_fixed_by_its_order() {
        let id = "0b6e8f3c-5d0a-5c4e-9a51-6f1f6f3f1b2a";
        assert_eq!(account_number(id), "ACC-0B6E8F3C5D0A");
        assert_eq!(account_number(id), account_number(id));
    }
}
