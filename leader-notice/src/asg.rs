//! EC2 Auto Scaling: the three Query API calls this crate makes (`DescribeAutoScalingInstances`,
//! `SetInstanceProtection`, `CompleteLifecycleAction`), signed with SigV4.
//!
//! Not `aws-sdk-autoscaling`: its build is long, and three calls are a form-encoded POST each,
//! answered in XML, of which this module reads a few elements.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::BehaviorVersion;
use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use tracing::debug;
use url::Url;

use crate::NoticeError;
use crate::http::prefix;

/// The Query API version of EC2 Auto Scaling.
const VERSION: &str = "2011-01-01";
/// The SigV4 signing name of EC2 Auto Scaling.
const SIGNING_NAME: &str = "autoscaling";
/// The service in [`NoticeError`]s.
const SERVICE: &str = "aws";
/// How long one call may take, credentials included.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The body's type, signed along with it.
const FORM: &str = "application/x-www-form-urlencoded; charset=utf-8";
/// The endpoint settings, first found wins (the AWS SDKs' names).
const ENDPOINT_VARS: [&str; 2] = ["AWS_ENDPOINT_URL_AUTO_SCALING", "AWS_ENDPOINT_URL"];

/// A client of EC2 Auto Scaling for this instance's own group: which group it is in, its
/// scale-in protection, and the completion of its terminate lifecycle action.
///
/// Credentials come from the AWS SDKs' default chain (environment, profile, web identity,
/// container and instance roles). The calls need these IAM actions:
/// `autoscaling:DescribeAutoScalingInstances` (on `Resource: "*"`: Describe actions have no
/// resource-level permissions), `autoscaling:SetInstanceProtection` and
/// `autoscaling:CompleteLifecycleAction` (both may be scoped to the group's ARN).
pub struct AutoScaling {
    http: reqwest::Client,
    endpoint: Url,
    region: String,
    credentials: SharedCredentialsProvider,
    /// The last credentials and when they were loaded, reused for 15 minutes at most and
    /// until five minutes before they expire: the chain alone caches nothing (the SDK clients
    /// do), and a web identity would cost an STS call each. Dropped on a refusal.
    cached: std::sync::Mutex<Option<(Credentials, tokio::time::Instant)>>,
}

/// How long before their expiry cached credentials are looked up again.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);

/// How long cached credentials are used at most (as the SDKs' own cache does for
/// credentials without an expiry, such as a profile's keys that may be rotated).
const CACHE_AT_MOST: Duration = Duration::from_secs(900);

impl fmt::Debug for AutoScaling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AutoScaling")
            .field("endpoint", &self.endpoint.as_str())
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl AutoScaling {
    /// The client of this environment: the endpoint from `AWS_ENDPOINT_URL_AUTO_SCALING`,
    /// else `AWS_ENDPOINT_URL`, else `https://autoscaling.{region}.amazonaws.com`; the region
    /// of this instance (instance metadata, `placement/region`: its group is there, whatever
    /// region `AWS_REGION` names for the store), else `AWS_REGION` or the profile's (off EC2);
    /// credentials from the SDKs' default chain, looked up at the first call and reused until
    /// shortly before they expire.
    ///
    /// # Errors
    /// [`NoticeError::Config`] if no region is found or an endpoint setting is not an
    /// `http(s)://` URL.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads settings.
    pub async fn from_env() -> Result<Self, NoticeError> {
        let setting = endpoint_setting();
        // The instance's own region first: its group lives there, whatever region the
        // environment names for the lease store. Its error says to set AWS_REGION.
        let region = crate::aws::region().await?;
        let config = aws_config::defaults(BehaviorVersion::latest())
            .http_client(sdk_http_client())
            .region(aws_config::Region::new(region.clone()))
            .load()
            .await;
        let credentials = config.credentials_provider().ok_or_else(|| {
            NoticeError::Config("no AWS credentials provider is configured".to_owned())
        })?;
        let endpoint = endpoint(setting, &region)?;
        debug!(endpoint = %endpoint, %region, "EC2 Auto Scaling client");
        Self::new(endpoint, region, credentials)
    }

    /// A client of `endpoint` in `region` with these credentials.
    pub(crate) fn new(
        endpoint: Url,
        region: String,
        credentials: SharedCredentialsProvider,
    ) -> Result<Self, NoticeError> {
        let http = crate::http::api_client(None)?;
        Ok(Self {
            http,
            endpoint,
            region,
            credentials,
            cached: std::sync::Mutex::new(None),
        })
    }

    /// This instance and its Auto Scaling group: `(instance id, group name)`. The instance id
    /// comes from the instance metadata, the group from `DescribeAutoScalingInstances`.
    ///
    /// # Errors
    /// [`NoticeError::Config`] if the instance is in no Auto Scaling group; the metadata
    /// service's or Auto Scaling's error otherwise ([`NoticeError::Denied`] names the missing
    /// permission).
    ///
    /// # Cancel safety
    /// Cancel-safe: it only reads.
    pub async fn this_instance(&self) -> Result<(String, String), NoticeError> {
        let instance = crate::aws::instance_id().await?;
        let group = self.group_of(&instance).await?.ok_or_else(|| {
            NoticeError::Config(format!(
                "instance {instance} is not in an Auto Scaling group (DescribeAutoScalingInstances \
                 does not list it): scale-in protection on aws needs one"
            ))
        })?;
        Ok((instance, group))
    }

    /// The Auto Scaling group of `instance`, if it is in one.
    ///
    /// # Errors
    /// Auto Scaling's error.
    pub(crate) async fn group_of(&self, instance: &str) -> Result<Option<String>, NoticeError> {
        let action = "DescribeAutoScalingInstances";
        let xml = self
            .call(action, &[("InstanceIds.member.1", instance)])
            .await?;
        if !xml.contains("DescribeAutoScalingInstancesResult") {
            return Err(malformed(action, &xml));
        }
        Ok(group_in_answer(&xml, instance))
    }

    /// Sets (`true`) or clears (`false`) the scale-in protection of `instance` in `group`.
    ///
    /// # Errors
    /// Auto Scaling's error: [`NoticeError::Denied`] without
    /// `autoscaling:SetInstanceProtection`, [`NoticeError::Unavailable`] when throttled or
    /// while the group is being updated (`ResourceContention`).
    ///
    /// # Cancel safety
    /// If cancelled, the call may or may not have reached Auto Scaling; it is idempotent.
    pub async fn set_instance_protection(
        &self,
        group: &str,
        instance: &str,
        protected: bool,
    ) -> Result<(), NoticeError> {
        let params = [
            ("AutoScalingGroupName", group),
            ("InstanceIds.member.1", instance),
            (
                "ProtectedFromScaleIn",
                if protected { "true" } else { "false" },
            ),
        ];
        self.call("SetInstanceProtection", &params).await?;
        Ok(())
    }

    /// Completes the lifecycle action of `instance` under the lifecycle hook `hook` of `group`
    /// with `CONTINUE`: an instance held in `Terminating:Wait` by a terminate hook goes on
    /// to terminate now, without waiting for the hook's timeout.
    ///
    /// # Errors
    /// Auto Scaling's error: [`NoticeError::Denied`] without
    /// `autoscaling:CompleteLifecycleAction`, [`NoticeError::Config`] (`ValidationError`)
    /// if there is no such hook or no action waits on it.
    ///
    /// # Cancel safety
    /// If cancelled, the call may or may not have reached Auto Scaling.
    pub async fn complete_lifecycle_action(
        &self,
        group: &str,
        hook: &str,
        instance: &str,
    ) -> Result<(), NoticeError> {
        let params = [
            ("AutoScalingGroupName", group),
            ("LifecycleHookName", hook),
            ("InstanceId", instance),
            ("LifecycleActionResult", "CONTINUE"),
        ];
        self.call("CompleteLifecycleAction", &params).await?;
        Ok(())
    }

    /// One call: signs it, sends it, returns the XML of a successful answer.
    async fn call(
        &self,
        action: &'static str,
        params: &[(&str, &str)],
    ) -> Result<String, NoticeError> {
        let exchange = async {
            let credentials = self.credentials(action).await?;
            let request = self.signed_request(action, params, &credentials, now())?;
            debug!(action, "EC2 Auto Scaling call");
            let response = self
                .http
                .execute(request)
                .await
                .map_err(|e| transport_error(action, &e))?;
            let status = response.status().as_u16();
            let body = response
                .text()
                .await
                .map_err(|e| transport_error(action, &e))?;
            let answered = answer(action, status, body);
            if let Err(NoticeError::Denied { .. }) = &answered {
                // Expired or revoked credentials: the next call loads them anew.
                *self.cached.lock().unwrap_or_else(|e| e.into_inner()) = None;
            }
            answered
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| NoticeError::Unavailable {
                service: SERVICE,
                message: format!(
                    "Auto Scaling {action}: no answer within {CALL_TIMEOUT:?} from {}",
                    self.endpoint
                ),
            })?
    }

    async fn credentials(&self, action: &str) -> Result<Credentials, NoticeError> {
        let fresh = |(c, at): &(Credentials, tokio::time::Instant)| {
            at.elapsed() < CACHE_AT_MOST && c.expiry().is_none_or(|at| at > now() + REFRESH_BEFORE)
        };
        if let Some((c, _)) = self
            .cached
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|c| fresh(c))
        {
            return Ok(c.clone());
        }
        let loaded = self.load_credentials(action).await?;
        *self.cached.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((loaded.clone(), tokio::time::Instant::now()));
        Ok(loaded)
    }

    async fn load_credentials(&self, action: &str) -> Result<Credentials, NoticeError> {
        self.credentials
            .provide_credentials()
            .await
            .map_err(|e| match e {
                CredentialsError::CredentialsNotLoaded(_) => NoticeError::Config(format!(
                    "Auto Scaling {action}: no AWS credentials were found (environment, profile, \
                     web identity, container or instance role)"
                )),
                other => NoticeError::Unavailable {
                    service: SERVICE,
                    message: format!(
                        "Auto Scaling {action}: could not load AWS credentials: {}",
                        crate::http::chain(&other)
                    ),
                },
            })
    }

    /// The signed POST of `action` at `time`.
    fn signed_request(
        &self,
        action: &str,
        params: &[(&str, &str)],
        credentials: &Credentials,
        time: SystemTime,
    ) -> Result<reqwest::Request, NoticeError> {
        let body = form_body(action, params);
        let url = self.endpoint.as_str();
        let failed = |e: &dyn fmt::Display| {
            NoticeError::Config(format!(
                "could not sign the Auto Scaling {action} call: {e}"
            ))
        };
        let identity: Identity = credentials.clone().into();
        let signing = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(SIGNING_NAME)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| failed(&e))?
            .into();
        let signable = SignableRequest::new(
            "POST",
            url,
            [("content-type", FORM)].into_iter(),
            SignableBody::Bytes(body.as_bytes()),
        )
        .map_err(|e| failed(&e))?;
        let (instructions, _signature) = sign(signable, &signing)
            .map_err(|e| failed(&e))?
            .into_parts();
        let mut builder = self.http.post(url).header("content-type", FORM);
        for (name, value) in instructions.headers() {
            let mut value = http::HeaderValue::from_str(value).map_err(|e| failed(&e))?;
            // Kept out of any debug output of the request.
            value.set_sensitive(matches!(name, "authorization" | "x-amz-security-token"));
            builder = builder.header(name, value);
        }
        builder.body(body).build().map_err(|e| failed(&e))
    }
}

/// The wall clock, for the signature's date (the one reading here; informational elsewhere).
fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(leader_core::wall_clock_unix_ms())
}

/// The HTTP client of the credential and region chains: HTTPS on rustls with the suite's
/// crypto provider.
fn sdk_http_client() -> aws_smithy_runtime_api::client::http::SharedHttpClient {
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    leader_core::tls::install_crypto_provider();
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
        .build_https()
}

/// The first endpoint setting that is set: `(variable, value)`.
fn endpoint_setting() -> Option<(&'static str, String)> {
    ENDPOINT_VARS.iter().find_map(|var| {
        std::env::var(var)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .map(|v| (*var, v))
    })
}

/// The endpoint: the setting, else the region's public one.
fn endpoint(setting: Option<(&str, String)>, region: &str) -> Result<Url, NoticeError> {
    let (from, text) = match setting {
        Some((var, value)) => (var.to_owned(), value),
        None => (
            format!("region {region:?}"),
            format!("https://autoscaling.{region}.amazonaws.com"),
        ),
    };
    let bad = |why: &str| {
        NoticeError::Config(format!(
            "the Auto Scaling endpoint {text:?} (from {from}) {why}"
        ))
    };
    let url = Url::parse(&text).map_err(|e| bad(&format!("does not parse: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad("must be an http:// or https:// URL with a host"));
    }
    Ok(url)
}

/// The form body of `action` with `params` (names and values percent-encoded).
fn form_body(action: &str, params: &[(&str, &str)]) -> String {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("Action", action);
    form.append_pair("Version", VERSION);
    for (name, value) in params {
        form.append_pair(name, value);
    }
    form.finish()
}

/// The group that a `DescribeAutoScalingInstances` answer gives for `instance`.
fn group_in_answer(xml: &str, instance: &str) -> Option<String> {
    elements(xml, "member").into_iter().find_map(|member| {
        let id = elements(&member, "InstanceId").into_iter().next()?;
        if id.trim() != instance {
            return None;
        }
        elements(&member, "AutoScalingGroupName")
            .into_iter()
            .next()
            .map(|g| g.trim().to_owned())
            .filter(|g| !g.is_empty())
    })
}

/// A successful answer's body, or the error it carries.
fn answer(action: &str, status: u16, body: String) -> Result<String, NoticeError> {
    if (200..300).contains(&status) {
        // A 2xx that is not Auto Scaling's (a captive proxy's page) must not pass for success.
        if body.contains(&format!("<{action}Response")) {
            return Ok(body);
        }
        return Err(malformed(action, &body));
    }
    Err(error_answer(action, status, &body))
}

/// The error of an answer with status `status`: from its `<Error><Code>` when it has one.
fn error_answer(action: &str, status: u16, body: &str) -> NoticeError {
    let first = |name| elements(body, name).into_iter().next();
    let code = first("Code").map(|c| c.trim().to_owned());
    let message = first("Message").unwrap_or_default();
    let said = match &code {
        Some(code) => format!("{code}: {}", message.trim()),
        None => format!("HTTP {status}: {}", prefix(body)),
    };
    let code = code.unwrap_or_default();
    let what = format!("Auto Scaling {action} failed ({said})");
    match code.as_str() {
        "AccessDenied"
        | "AccessDeniedException"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "UnrecognizedClientException"
        | "MissingAuthenticationToken"
        | "IncompleteSignature"
        | "AuthFailure" => NoticeError::Denied {
            service: SERVICE,
            message: format!("{what}; {}", permission_hint(action)),
        },
        "Throttling"
        | "ThrottlingException"
        | "RequestLimitExceeded"
        | "ResourceContention"
        | "ServiceUnavailable"
        | "InternalFailure"
        | "RequestExpired"
        | "ExpiredToken" => NoticeError::Unavailable {
            service: SERVICE,
            message: format!("{what}; retrying"),
        },
        "ValidationError"
        | "InvalidParameterValue"
        | "InvalidParameterCombination"
        | "MissingParameter"
        | "InvalidAction"
        | "LimitExceeded" => {
            NoticeError::Config(format!("{what}; check the group, hook and instance"))
        }
        _ if status >= 500 || status == 429 => NoticeError::Unavailable {
            service: SERVICE,
            message: format!("{what}; retrying"),
        },
        _ if status == 401 || status == 403 => NoticeError::Denied {
            service: SERVICE,
            message: format!("{what}; {}", permission_hint(action)),
        },
        "" => NoticeError::Config(format!(
            "{what}; is the endpoint (AWS_ENDPOINT_URL_AUTO_SCALING, AWS_ENDPOINT_URL) \
             EC2 Auto Scaling?"
        )),
        _ => NoticeError::Config(what),
    }
}

/// What the instance's role needs for `action`.
fn permission_hint(action: &str) -> String {
    let scope = if action.starts_with("Describe") {
        " on Resource \"*\" (Describe actions have no resource-level permissions)"
    } else {
        " on the Auto Scaling group"
    };
    format!(
        "the credentials (the instance's IAM role) need autoscaling:{action}{scope}, and must \
         be valid"
    )
}

fn malformed(action: &str, body: &str) -> NoticeError {
    NoticeError::Malformed {
        service: SERVICE,
        message: format!(
            "Auto Scaling {action} answered without a {action}Response: {}",
            prefix(body)
        ),
    }
}

fn transport_error(action: &str, error: &reqwest::Error) -> NoticeError {
    crate::http::transport_error(SERVICE, &format!("Auto Scaling {action}"), error)
}

/// The text of each element `name` of `xml`, in document order, entities decoded.
///
/// Enough for Auto Scaling's answers: no namespace prefixes, no element nested in one of the
/// same name. A self-closing element (`<Name/>`) has empty text; an element that is not
/// closed ends the search.
fn elements(xml: &str, name: &str) -> Vec<String> {
    let open = format!("<{name}");
    let close = format!("</{name}>");
    let mut found = Vec::new();
    let mut rest = xml;
    while let Some(at) = rest.find(&open) {
        let after = &rest[at + open.len()..];
        // `<Code>` but not `<CodeName>`: the name ends at '>', '/' or white space.
        match after.chars().next() {
            Some('>' | '/') => {}
            Some(c) if c.is_whitespace() => {}
            _ => {
                rest = after;
                continue;
            }
        }
        let Some(end_of_tag) = after.find('>') else {
            break;
        };
        if after[..end_of_tag].ends_with('/') {
            found.push(String::new());
            rest = &after[end_of_tag + 1..];
            continue;
        }
        let content = &after[end_of_tag + 1..];
        let Some(end) = content.find(&close) else {
            break;
        };
        found.push(unescape(&content[..end]));
        rest = &content[end + close.len()..];
    }
    found
}

/// `text` with XML's character references and CDATA sections decoded.
fn unescape(text: &str) -> String {
    if let Some(inner) = text
        .trim()
        .strip_prefix("<![CDATA[")
        .and_then(|t| t.strip_suffix("]]>"))
    {
        return inner.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let tail = &rest[amp..];
        let decoded = tail.find(';').and_then(|semi| {
            let c = match &tail[1..semi] {
                "lt" => Some('<'),
                "gt" => Some('>'),
                "amp" => Some('&'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                num => num
                    .strip_prefix("#x")
                    .map(|hex| u32::from_str_radix(hex, 16))
                    .or_else(|| num.strip_prefix('#').map(str::parse::<u32>))
                    .and_then(Result::ok)
                    .and_then(char::from_u32),
            };
            c.map(|c| (c, semi + 1))
        });
        match decoded {
            Some((c, len)) => {
                out.push(c);
                rest = &tail[len..];
            }
            None => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DESCRIBE: &str = r#"<DescribeAutoScalingInstancesResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">
  <DescribeAutoScalingInstancesResult>
    <AutoScalingInstances>
      <member>
        <HealthStatus>HEALTHY</HealthStatus>
        <AutoScalingGroupName>web &amp; api</AutoScalingGroupName>
        <InstanceId>i-0abc</InstanceId>
        <ProtectedFromScaleIn>false</ProtectedFromScaleIn>
        <LifecycleState>InService</LifecycleState>
      </member>
    </AutoScalingInstances>
  </DescribeAutoScalingInstancesResult>
  <ResponseMetadata><RequestId>r-1</RequestId></ResponseMetadata>
</DescribeAutoScalingInstancesResponse>"#;

    const EMPTY: &str = r#"<DescribeAutoScalingInstancesResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/">
  <DescribeAutoScalingInstancesResult><AutoScalingInstances/></DescribeAutoScalingInstancesResult>
</DescribeAutoScalingInstancesResponse>"#;

    fn error_xml(code: &str, message: &str) -> String {
        format!(
            "<ErrorResponse xmlns=\"http://autoscaling.amazonaws.com/doc/2011-01-01/\">\
             <Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>\
             <RequestId>r-2</RequestId></ErrorResponse>"
        )
    }

    #[test]
    fn elements_are_found_by_exact_name_and_decoded() {
        let xml = "<a><CodeName>no</CodeName><Code attr=\"1\">A&lt;B&#65;&#x42;&amp;x</Code>\
                   <Code/><Code>&bogus; &amp</Code><Code><![CDATA[<raw>&]]></Code></a>";
        assert_eq!(
            elements(xml, "Code"),
            vec!["A<BAB&x", "", "&bogus; &amp", "<raw>&"]
        );
        assert_eq!(elements(xml, "CodeName"), vec!["no"]);
        assert!(elements(xml, "Missing").is_empty());
        // Not closed: nothing made up.
        assert!(elements("<Code>open", "Code").is_empty());
    }

    #[test]
    fn the_group_is_read_for_this_instance_only() {
        assert_eq!(
            group_in_answer(DESCRIBE, "i-0abc").as_deref(),
            Some("web & api")
        );
        assert_eq!(group_in_answer(DESCRIBE, "i-other"), None);
        assert_eq!(group_in_answer(EMPTY, "i-0abc"), None);
    }

    #[test]
    fn a_success_needs_the_action_s_response() {
        let ok = answer("DescribeAutoScalingInstances", 200, DESCRIBE.to_owned());
        assert_eq!(ok.unwrap(), DESCRIBE);
        let page = answer(
            "SetInstanceProtection",
            200,
            "<html>portal</html>".to_owned(),
        );
        assert!(
            matches!(page, Err(NoticeError::Malformed { .. })),
            "{page:?}"
        );
    }

    #[test]
    fn refusals_name_the_permission() {
        for code in [
            "AccessDenied",
            "UnauthorizedOperation",
            "InvalidClientTokenId",
            "SignatureDoesNotMatch",
        ] {
            let e = error_answer("SetInstanceProtection", 403, &error_xml(code, "no"));
            let NoticeError::Denied { service, message } = &e else {
                panic!("{code}: {e:?}");
            };
            assert_eq!(*service, "aws");
            assert!(message.contains(code), "{message}");
            assert!(
                message.contains("autoscaling:SetInstanceProtection"),
                "{message}"
            );
        }
        let e = error_answer(
            "DescribeAutoScalingInstances",
            403,
            &error_xml("AccessDenied", "x"),
        );
        assert!(
            e.to_string()
                .contains("autoscaling:DescribeAutoScalingInstances on Resource \"*\""),
            "{e}"
        );
        let e = error_answer("CompleteLifecycleAction", 403, "<html>forbidden</html>");
        assert!(
            matches!(&e, NoticeError::Denied { message, .. } if message.contains("autoscaling:CompleteLifecycleAction")),
            "{e:?}"
        );
    }

    #[test]
    fn throttling_contention_and_5xx_are_retried() {
        for (status, body) in [
            (400, error_xml("Throttling", "Rate exceeded")),
            (400, error_xml("ResourceContention", "pending update")),
            (500, error_xml("InternalFailure", "oops")),
            (503, "<html>bad gateway</html>".to_owned()),
            (500, String::new()),
        ] {
            let e = error_answer("SetInstanceProtection", status, &body);
            assert!(
                matches!(e, NoticeError::Unavailable { service: "aws", .. }),
                "{status} {body}: {e:?}"
            );
            assert!(e.is_retryable());
        }
    }

    #[test]
    fn validation_errors_are_configuration() {
        let e = error_answer(
            "CompleteLifecycleAction",
            400,
            &error_xml(
                "ValidationError",
                "No active Lifecycle Action found with instance ID i-1",
            ),
        );
        let NoticeError::Config(message) = &e else {
            panic!("{e:?}");
        };
        assert!(
            message.contains("ValidationError: No active Lifecycle Action"),
            "{message}"
        );
        let e = error_answer("SetInstanceProtection", 404, "<html>not here</html>");
        assert!(
            matches!(&e, NoticeError::Config(m) if m.contains("AWS_ENDPOINT_URL")),
            "{e:?}"
        );
    }

    #[test]
    fn endpoints_come_from_the_setting_else_the_region() {
        let url = endpoint(None, "eu-west-1").unwrap();
        assert_eq!(url.as_str(), "https://autoscaling.eu-west-1.amazonaws.com/");
        let url = endpoint(
            Some(("AWS_ENDPOINT_URL", "http://127.0.0.1:5000".to_owned())),
            "x",
        )
        .unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:5000/");
        for bad in ["127.0.0.1:5000", "ftp://host", "http://", "not a url"] {
            let e =
                endpoint(Some(("AWS_ENDPOINT_URL_AUTO_SCALING", bad.to_owned())), "x").unwrap_err();
            assert!(
                matches!(&e, NoticeError::Config(m) if m.contains("AWS_ENDPOINT_URL_AUTO_SCALING")),
                "{bad}: {e:?}"
            );
        }
    }

    fn client(token: Option<&str>) -> (AutoScaling, Credentials) {
        let credentials = Credentials::new(
            "AKIDTEST",
            "secret-key",
            token.map(str::to_owned),
            None,
            "test",
        );
        let client = AutoScaling::new(
            Url::parse("http://127.0.0.1:5000").unwrap(),
            "eu-west-1".to_owned(),
            SharedCredentialsProvider::new(credentials.clone()),
        )
        .unwrap();
        (client, credentials)
    }

    fn header(request: &reqwest::Request, name: &str) -> String {
        request
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    }

    #[test]
    fn requests_are_signed_form_posts() {
        let (client, credentials) = client(None);
        let time = UNIX_EPOCH + Duration::from_secs(1_704_164_645); // 2024-01-02T03:04:05Z
        let params = [
            ("AutoScalingGroupName", "web & api"),
            ("InstanceIds.member.1", "i-0abc"),
            ("ProtectedFromScaleIn", "true"),
        ];
        let request = client
            .signed_request("SetInstanceProtection", &params, &credentials, time)
            .unwrap();
        assert_eq!(request.method(), "POST");
        assert_eq!(request.url().as_str(), "http://127.0.0.1:5000/");
        let body = std::str::from_utf8(request.body().unwrap().as_bytes().unwrap()).unwrap();
        assert_eq!(
            body,
            "Action=SetInstanceProtection&Version=2011-01-01&AutoScalingGroupName=web+%26+api\
             &InstanceIds.member.1=i-0abc&ProtectedFromScaleIn=true"
        );
        assert_eq!(header(&request, "content-type"), FORM);
        assert_eq!(header(&request, "x-amz-date"), "20240102T030405Z");
        let authorization = header(&request, "authorization");
        assert!(
            authorization.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKIDTEST/20240102/eu-west-1/autoscaling/aws4_request, \
                 SignedHeaders=content-type;host;x-amz-date, Signature="
            ),
            "{authorization}"
        );
        assert!(!authorization.contains("secret-key"));
        assert!(header(&request, "x-amz-security-token").is_empty());

        // The body is signed: another body, another signature.
        let other = client
            .signed_request(
                "SetInstanceProtection",
                &[("ProtectedFromScaleIn", "false")],
                &credentials,
                time,
            )
            .unwrap();
        assert_ne!(header(&other, "authorization"), authorization);
    }

    #[test]
    fn a_session_token_is_sent() {
        let (client, credentials) = client(Some("session-token"));
        let request = client
            .signed_request("DescribeAutoScalingInstances", &[], &credentials, now())
            .unwrap();
        assert_eq!(header(&request, "x-amz-security-token"), "session-token");
        assert!(header(&request, "authorization").contains("x-amz-security-token"));
    }
}
