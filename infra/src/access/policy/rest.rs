//! The REST-JSON services the proxy maps (X-Ray's segments, EventBridge Scheduler, Lambda's
//! invocations): each operation by its method and path template, with the resource ARN it is
//! authorised on, from the path, the query and the body as the service's IAM reference says.

use serde_json::Value;

use super::read::Scope;
use super::verdict::Need;
use super::wire::{AwsRequest, form_pairs};
use crate::emulation::template::LOCAL_ACCOUNT;

/// One operation: `{Name}` in its path stands for one segment, percent-decoded.
struct Route {
    service: &'static str,
    method: &'static str,
    path: &'static str,
    operation: &'static str,
    /// The IAM action, when it is not `<service>:<operation>`.
    action: Option<&'static str>,
    needs: fn(&Matched<'_>, &str) -> Result<Vec<Need>, String>,
}

/// A request matched to its route: the path's segments the template names, and the request.
struct Matched<'a> {
    captures: Vec<(&'static str, String)>,
    request: &'a AwsRequest<'a>,
    scope: &'a Scope,
}

impl Matched<'_> {
    fn capture(&self, name: &str) -> &str {
        self.captures.iter().find(|(n, _)| *n == name).map_or("", |(_, v)| v.as_str())
    }

    fn query(&self, name: &str) -> Option<String> {
        form_pairs(self.request.query).into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    fn body(&self) -> Result<Value, String> {
        if self.request.body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(self.request.body).map_err(|e| format!("the body is not JSON: {e}"))
    }

    fn arn(&self, service: &str, rest: &str) -> String {
        format!("arn:aws:{service}:{}:{LOCAL_ACCOUNT}:{rest}", self.scope.region)
    }
}

const ROUTES: &[Route] = &[
    // X-Ray's trace segments, which the functions send themselves: its write actions take no
    // resource.
    Route {
        service: "xray",
        method: "POST",
        path: "/TraceSegments",
        operation: "PutTraceSegments",
        action: None,
        needs: anything,
    },
    // EventBridge Scheduler: a schedule lives in a group (`default` unless named), given in the
    // body when it is written and in the query when it is read or deleted. Creating or
    // updating one also passes the role its target runs as.
    Route {
        service: "scheduler",
        method: "POST",
        path: "/schedules/{Name}",
        operation: "CreateSchedule",
        action: None,
        needs: schedule_written,
    },
    Route {
        service: "scheduler",
        method: "PUT",
        path: "/schedules/{Name}",
        operation: "UpdateSchedule",
        action: None,
        needs: schedule_written,
    },
    Route {
        service: "scheduler",
        method: "GET",
        path: "/schedules/{Name}",
        operation: "GetSchedule",
        action: None,
        needs: schedule_named,
    },
    Route {
        service: "scheduler",
        method: "DELETE",
        path: "/schedules/{Name}",
        operation: "DeleteSchedule",
        action: None,
        needs: schedule_named,
    },
    Route {
        service: "scheduler",
        method: "GET",
        path: "/schedules",
        operation: "ListSchedules",
        action: None,
        needs: anything,
    },
    Route {
        service: "scheduler",
        method: "POST",
        path: "/schedule-groups/{Name}",
        operation: "CreateScheduleGroup",
        action: None,
        needs: schedule_group,
    },
    Route {
        service: "scheduler",
        method: "GET",
        path: "/schedule-groups/{Name}",
        operation: "GetScheduleGroup",
        action: None,
        needs: schedule_group,
    },
    Route {
        service: "scheduler",
        method: "DELETE",
        path: "/schedule-groups/{Name}",
        operation: "DeleteScheduleGroup",
        action: None,
        needs: schedule_group,
    },
    // Lambda: a function named by its name, its ARN or a partial ARN, with a version or alias
    // in the query (`Qualifier`).
    Route {
        service: "lambda",
        method: "POST",
        path: "/2015-03-31/functions/{FunctionName}/invocations",
        operation: "Invoke",
        action: Some("lambda:InvokeFunction"),
        needs: function,
    },
    Route {
        service: "lambda",
        method: "GET",
        path: "/2015-03-31/functions/{FunctionName}",
        operation: "GetFunction",
        action: None,
        needs: function,
    },
];

/// The operation a REST-JSON request of `service` is, and what it needs; `None` if no route
/// of the service matches it.
pub(super) fn rest_json(
    service: &str,
    request: &AwsRequest<'_>,
    scope: &Scope,
) -> Option<(&'static str, Result<Vec<Need>, String>)> {
    ROUTES.iter().filter(|r| r.service == service).find_map(|route| {
        let captures = matched(route, request)?;
        let action = route
            .action
            .map_or_else(|| format!("{}:{}", route.service, route.operation), str::to_owned);
        let matched = Matched { captures, request, scope };
        Some((route.operation, (route.needs)(&matched, &action)))
    })
}

/// Whether `service` is a REST-JSON service the proxy maps.
pub fn maps(service: &str) -> bool {
    ROUTES.iter().any(|r| r.service == service)
}

/// The captures of `route`'s path in `request`'s, if its method and path match.
fn matched(route: &Route, request: &AwsRequest<'_>) -> Option<Vec<(&'static str, String)>> {
    if !route.method.eq_ignore_ascii_case(request.method) {
        return None;
    }
    let template: Vec<&str> = route.path.trim_matches('/').split('/').collect();
    let path: Vec<&str> = request.path.trim_matches('/').split('/').collect();
    if template.len() != path.len() {
        return None;
    }
    let mut captures = Vec::new();
    for (t, p) in template.iter().zip(&path) {
        match t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
            Some(name) if !p.is_empty() => {
                let value = percent_encoding::percent_decode_str(p).decode_utf8_lossy();
                captures.push((name, value.into_owned()));
            }
            Some(_) => return None,
            None if t == p => {}
            None => return None,
        }
    }
    Some(captures)
}

fn anything(_: &Matched<'_>, action: &str) -> Result<Vec<Need>, String> {
    Ok(vec![Need::new(action, "*")])
}

fn schedule_arn(m: &Matched<'_>, group: Option<String>) -> String {
    let group = group.filter(|g| !g.is_empty()).unwrap_or_else(|| "default".to_owned());
    m.arn("scheduler", &format!("schedule/{group}/{}", m.capture("Name")))
}

fn schedule_named(m: &Matched<'_>, action: &str) -> Result<Vec<Need>, String> {
    Ok(vec![Need::new(action, schedule_arn(m, m.query("groupName")))])
}

fn schedule_written(m: &Matched<'_>, action: &str) -> Result<Vec<Need>, String> {
    let body = m.body()?;
    let group = body.get("GroupName").and_then(Value::as_str).map(str::to_owned);
    let mut needs = vec![Need::new(action, schedule_arn(m, group))];
    let role = body.pointer("/Target/RoleArn").and_then(Value::as_str);
    needs.push(Need::new("iam:PassRole", role.ok_or("no Target.RoleArn")?));
    Ok(needs)
}

fn schedule_group(m: &Matched<'_>, action: &str) -> Result<Vec<Need>, String> {
    Ok(vec![Need::new(
        action,
        m.arn("scheduler", &format!("schedule-group/{}", m.capture("Name"))),
    )])
}

fn function(m: &Matched<'_>, action: &str) -> Result<Vec<Need>, String> {
    let named = m.capture("FunctionName");
    // `name`, `name:qualifier`, `<account>:function:name[:qualifier]`, or the whole ARN.
    let arn = if named.starts_with("arn:") {
        named.to_owned()
    } else if let Some(rest) = named.split_once(":function:").map(|(_, rest)| rest) {
        m.arn("lambda", &format!("function:{rest}"))
    } else {
        m.arn("lambda", &format!("function:{named}"))
    };
    let arn = match m.query("Qualifier") {
        Some(q) if !q.is_empty() => format!("{arn}:{q}"),
        _ => arn,
    };
    Ok(vec![Need::new(action, arn)])
}
