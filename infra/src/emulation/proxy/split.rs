//! moto keeps the system attributes of a message sent alone (`SendMessage`), but drops each
//! entry's of a batch (`SendMessageBatch`): the trace header (`AWSTraceHeader`) would not reach
//! the consumer, as it does on AWS. A batch with an entry whose trace is kept (`Sampled=1`) is
//! therefore sent to the emulator entry by entry, and answered as the batch it was: one
//! request, counted once. A batch of unsampled traces goes whole, as the emulator is the local
//! stack's bottleneck: their consumers decide the same from the trace id, and lose only the
//! name of a parent segment nobody records.

use serde_json::{Map, Value, json};

/// The entries of a `SendMessageBatch` body (JSON protocol) as `SendMessage` bodies, with their
/// ids; `None` if no entry's trace is kept (the batch goes as it is).
pub(super) fn entries_as_sends(body: &[u8]) -> Option<Vec<(String, Value)>> {
    let batch: Value = serde_json::from_slice(body).ok()?;
    let entries = batch["Entries"].as_array()?;
    let kept = |e: &Value| {
        e.pointer("/MessageSystemAttributes/AWSTraceHeader/StringValue")
            .and_then(Value::as_str)
            .is_some_and(|h| h.contains("Sampled=1"))
    };
    if !entries.iter().any(kept) {
        return None;
    }
    let queue = batch.get("QueueUrl")?.clone();
    let sends = entries.iter().map(|entry| {
        let mut send = Map::new();
        send.insert("QueueUrl".into(), queue.clone());
        for (field, value) in entry.as_object().into_iter().flatten() {
            if field != "Id" {
                send.insert(field.clone(), value.clone());
            }
        }
        (entry["Id"].as_str().unwrap_or_default().to_owned(), Value::Object(send))
    });
    Some(sends.collect())
}

/// What a `SendMessage` answered for the entry `id`: its part of the batch's answer, a success
/// (`Ok`) or a failure (`Err`).
pub(super) fn entry_result(id: &str, ok: bool, answer: &[u8]) -> Result<Value, Value> {
    let answer: Value = serde_json::from_slice(answer).unwrap_or_default();
    if ok {
        let mut entry = json!({"Id": id});
        for field in ["MessageId", "MD5OfMessageBody", "MD5OfMessageAttributes", "SequenceNumber"] {
            if let Some(value) = answer.get(field) {
                entry[field] = value.clone();
            }
        }
        Ok(entry)
    } else {
        let code = answer["__type"].as_str().unwrap_or("InternalError");
        Err(json!({
            "Id": id,
            "SenderFault": !code.contains("Internal"),
            "Code": code.rsplit('#').next().unwrap_or(code),
            "Message": answer["message"].as_str().or(answer["Message"].as_str()).unwrap_or(""),
        }))
    }
}

/// The batch's answer from its entries' results.
pub(super) fn batch_answer(results: Vec<Result<Value, Value>>) -> Value {
    let (mut successful, mut failed) = (Vec::new(), Vec::new());
    for result in results {
        match result {
            Ok(entry) => successful.push(entry),
            Err(entry) => failed.push(entry),
        }
    }
    json!({"Successful": successful, "Failed": failed})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_with_trace_headers_is_sent_entry_by_entry_and_answered_as_one() {
        let header = |h: &str| json!({"AWSTraceHeader": {"DataType": "String", "StringValue": h}});
        let plain = json!({"QueueUrl": "q", "Entries": [
            {"Id": "0", "MessageBody": "a"},
            {"Id": "1", "MessageBody": "b", "MessageSystemAttributes": header("Root=1-a-b;Sampled=0")},
        ]});
        assert!(entries_as_sends(plain.to_string().as_bytes()).is_none());
        let traced = json!({"QueueUrl": "q", "Entries": [
            {"Id": "0", "MessageBody": "a", "DelaySeconds": 3,
                "MessageSystemAttributes": header("Root=1-a-b;Sampled=1")},
            {"Id": "1", "MessageBody": "b"},
        ]});
        let sends = entries_as_sends(traced.to_string().as_bytes()).unwrap();
        assert_eq!(sends.len(), 2);
        assert_eq!(sends[0].0, "0");
        assert_eq!(sends[0].1["QueueUrl"], "q");
        assert_eq!(sends[0].1["DelaySeconds"], 3);
        assert_eq!(sends[0].1["MessageSystemAttributes"], header("Root=1-a-b;Sampled=1"));
        assert!(sends[0].1.get("Id").is_none());

        let sent = entry_result("0", true, br#"{"MessageId":"m","MD5OfMessageBody":"x"}"#);
        let refused = entry_result(
            "1",
            false,
            br#"{"__type":"com.amazonaws.sqs#InvalidParameterValue","message":"bad"}"#,
        );
        let answer = batch_answer(vec![sent, refused]);
        assert_eq!(
            answer["Successful"],
            json!([{"Id": "0", "MessageId": "m", "MD5OfMessageBody": "x"}])
        );
        assert_eq!(
            answer["Failed"],
            json!([{"Id": "1", "SenderFault": true, "Code": "InvalidParameterValue", "Message": "bad"}])
        );
    }
}
