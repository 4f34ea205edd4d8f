//! The functions' metrics, read locally as CloudWatch reads them on AWS: each line a function
//! prints in the embedded metric format is taken out of its log and added to a series per
//! metric name and dimension values.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// Samples kept per series for percentiles; the count and sum go on past it.
const KEPT_SAMPLES: usize = 100_000;

/// One metric under one set of dimension values.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SeriesKey {
    pub name: String,
    /// Dimension name to value, `Function` included.
    pub dimensions: BTreeMap<String, String>,
}

/// What a series holds: every sample's count and sum, and the samples themselves (up to
/// [`KEPT_SAMPLES`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    pub count: u64,
    pub sum: f64,
    pub samples: Vec<f64>,
}

impl Series {
    /// The `q` quantile (0 to 1) of the kept samples, if any.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let mut sorted = self.samples.clone();
        sorted.sort_by(f64::total_cmp);
        let last = sorted.len().checked_sub(1)?;
        let at = ((last as f64) * q.clamp(0.0, 1.0)).round() as usize;
        sorted.get(at).copied()
    }
}

/// Every series the functions reported, shared by the processes' output readers.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    series: Arc<Mutex<BTreeMap<SeriesKey, Series>>>,
    /// Metric lines read, and their bytes: what CloudWatch Logs would ingest for them.
    lines: Arc<(AtomicU64, AtomicU64)>,
}

impl Metrics {
    /// Adds the metrics of `line` if it is an embedded-metric document; says whether it was.
    pub fn ingest(&self, line: &str) -> bool {
        if !line.starts_with("{\"_aws\"") {
            return false;
        }
        let Ok(document) = serde_json::from_str::<Value>(line) else { return false };
        let Some(directives) =
            document.pointer("/_aws/CloudWatchMetrics").and_then(Value::as_array)
        else {
            return false;
        };
        self.lines.0.fetch_add(1, Ordering::Relaxed);
        // The newline is ingested too.
        self.lines.1.fetch_add(line.len() as u64 + 1, Ordering::Relaxed);
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for directive in directives {
            let dimensions: BTreeMap<String, String> = directive
                .pointer("/Dimensions/0")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .filter_map(|d| Some((d.to_owned(), document.get(d)?.as_str()?.to_owned())))
                .collect();
            let names = directive.get("Metrics").and_then(Value::as_array).into_iter().flatten();
            for name in names.filter_map(|m| m.get("Name").and_then(Value::as_str)) {
                let values: Vec<f64> = match document.get(name) {
                    Some(Value::Array(values)) => values.iter().filter_map(Value::as_f64).collect(),
                    Some(value) => value.as_f64().into_iter().collect(),
                    None => Vec::new(),
                };
                let key = SeriesKey { name: name.to_owned(), dimensions: dimensions.clone() };
                let s = series.entry(key).or_default();
                for v in values {
                    s.count += 1;
                    s.sum += v;
                    if s.samples.len() < KEPT_SAMPLES {
                        s.samples.push(v);
                    }
                }
            }
        }
        true
    }

    /// Metric lines read so far, and their bytes.
    pub fn lines(&self) -> (u64, u64) {
        (self.lines.0.load(Ordering::Relaxed), self.lines.1.load(Ordering::Relaxed))
    }

    /// Every series so far.
    pub fn snapshot(&self) -> BTreeMap<SeriesKey, Series> {
        self.series.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The series of `name` merged across functions, by the value of `dimension` (all under
    /// `""` if it has none).
    pub fn by(&self, name: &str, dimension: &str) -> BTreeMap<String, Series> {
        let mut out: BTreeMap<String, Series> = BTreeMap::new();
        for (key, s) in self.series.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if key.name != name {
                continue;
            }
            let value = key.dimensions.get(dimension).cloned().unwrap_or_default();
            let merged = out.entry(value).or_default();
            merged.count += s.count;
            merged.sum += s.sum;
            merged.samples.extend(&s.samples);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_metric_lines_are_added_up_and_other_lines_left_alone() {
        let m = Metrics::default();
        let ended = |n: u32| {
            format!(
                r#"{{"_aws":{{"Timestamp":1,"CloudWatchMetrics":[{{"Namespace":"N","Dimensions":[["Function","outcome"]],"Metrics":[{{"Name":"OrdersEnded","Unit":"Count"}}]}}]}},"Function":"scheduler","outcome":"processed","OrdersEnded":{n}}}"#
            )
        };
        assert!(m.ingest(&ended(2)));
        assert!(m.ingest(&ended(1)));
        let times = r#"{"_aws":{"Timestamp":1,"CloudWatchMetrics":[{"Namespace":"N","Dimensions":[["Function","outcome"]],"Metrics":[{"Name":"TimeToTerminal","Unit":"Seconds"}]}]},"Function":"scheduler","outcome":"processed","TimeToTerminal":[1.0,3.0,2.0]}"#;
        assert!(m.ingest(times));
        assert!(!m.ingest(r#"{"level":"INFO","message":"order accepted"}"#));
        assert!(!m.ingest("{\"_aws\": not json"));

        let ended = m.by("OrdersEnded", "outcome");
        assert_eq!((ended["processed"].count, ended["processed"].sum), (2, 3.0));
        let times = &m.by("TimeToTerminal", "outcome")["processed"];
        assert_eq!(
            (times.count, times.quantile(0.5), times.quantile(1.0)),
            (3, Some(2.0), Some(3.0))
        );
        assert_eq!(m.lines().0, 3);
        let key = m.snapshot().into_keys().next().unwrap();
        assert_eq!(key.dimensions["Function"], "scheduler");
    }
}
