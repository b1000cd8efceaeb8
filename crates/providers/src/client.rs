//! One provider's client: chat (plain or structured) and embeddings, with the response cache,
//! the rate and concurrency limits, and bounded retries of transient faults around every call.
//!
//! ## Why this layer retries and sleeps
//!
//! Everywhere else in skilleval, runners and strategies never sleep or retry: the executor (CLI)
//! or the worker's delay queues own that. Provider calls are the one exception, on purpose. A
//! 429 is not a failure of the case: the provider is telling us *when* to come back, and a run
//! must never lose a case to a rate limit. Waiting it out here costs only the wait, whereas
//! handing it up would re-run the whole attempt — producing the output again (tokens, money, a
//! different output) just because the *judge* call was throttled. So a transient fault (429,
//! 5xx, connection failure, request timeout) is retried here up to `max_retries` times with
//! exponential backoff and full jitter, never sooner than the provider's `Retry-After`. The
//! waiting is bounded: by `max_retries`, by `max_retry_wait_ms` (a provider asking for more is
//! handed up at once, with its `retry_after_ms`, for the executor or worker to schedule), and by
//! the case's own timeout, which cancels the call. When retries run out the transient fault
//! goes up unchanged, so the executor/worker can still retry the case later.
//!
//! Every response carries its [`Usage`] priced with the provider's prices; a cache hit spent
//! nothing and says so (`cached: true`, zero usage).

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::anthropic::{self, ANTHROPIC_VERSION};
use super::cache::{cache_key, NoCache, ResponseCache};
use super::chat::{ChatRequest, ChatResponse, Embeddings};
use super::config::{
    ApiKey, ConfigError, ProviderConfig, ProviderKind, DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_RETRIES, DEFAULT_MAX_RETRY_WAIT_MS,
};
use super::faults::{fault_from_status, fault_from_transport, redact};
use super::limit::{AdaptiveLimiter, RateLimiter, Unlimited};
use super::openai::{self, StructuredMode};
use skilleval_model::grade::RetryPolicy;
use skilleval_model::grade::{Fault, Usage};

/// How the call layer retries a transient fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallRetry {
    /// Retries after the first request.
    pub max_retries: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// A provider asking to wait longer than this is handed up instead of waited out here.
    pub max_wait: Duration,
}

impl Default for CallRetry {
    fn default() -> Self {
        CallRetry {
            max_retries: DEFAULT_MAX_RETRIES,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            max_wait: Duration::from_millis(DEFAULT_MAX_RETRY_WAIT_MS),
        }
    }
}

impl CallRetry {
    /// Delay before retry `retry` (1, 2, ...): exponential with full jitter (between half and
    /// all of it), never under what the provider asked for. Retry `n` is delivery `n + 1`, so
    /// this is [`RetryPolicy::delay`] with the same base and cap.
    pub fn delay(&self, retry: u32, fault: &Fault) -> Duration {
        RetryPolicy {
            max_attempts: self.max_retries.saturating_add(1),
            base_delay: self.base_delay,
            max_delay: self.max_delay,
        }
        .delay(retry.saturating_add(1), fault)
    }
}

/// A failed request: the fault, and the HTTP status when there was one.
#[derive(Debug)]
struct SendError {
    fault: Fault,
    status: Option<u16>,
}

impl SendError {
    fn shape(provider: &str, what: &str, problem: &str) -> Self {
        SendError {
            fault: Fault::transient(format!(
                "provider `{provider}` sent a {what} answer skilleval cannot read: {problem}"
            )),
            status: None,
        }
    }
}

/// A successful request's JSON, and whether the provider said its budget is exhausted.
struct Answer {
    body: Value,
    headroom_low: bool,
}

/// A client of one provider.
pub struct LlmClient {
    config: ProviderConfig,
    key: Option<ApiKey>,
    http: reqwest::Client,
    cache: Arc<dyn ResponseCache>,
    concurrency: AdaptiveLimiter,
    rate: Arc<dyn RateLimiter>,
    retry: CallRetry,
    /// The structured-output form this provider accepts ([`StructuredMode`] as a number).
    mode: AtomicU8,
    /// HTTP requests sent (retries included), for logs, metrics and tests.
    requests: AtomicU64,
    /// Answers that were HTTP 429 (rate limited), for metrics.
    rate_limited: AtomicU64,
}

impl std::fmt::Debug for LlmClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmClient")
            .field("provider", &self.config.name)
            .field("kind", &self.config.kind)
            .field("model", &self.config.model)
            .field("base_url", &self.config.base_url())
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl LlmClient {
    /// A client with no cache and no rate limit; `key` is usually [`ApiKey::from_env`].
    pub fn new(config: ProviderConfig, key: Option<ApiKey>) -> Result<Self, ConfigError> {
        let problems = config.check();
        if !problems.is_empty() {
            return Err(ConfigError::Invalid(problems.join("; ")));
        }
        let timeout = Duration::from_millis(config.timeout_ms);
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("skilleval/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                ConfigError::Invalid(format!(
                    "provider `{}`: could not build an HTTP client: {e}",
                    config.name
                ))
            })?;
        let retry = CallRetry {
            max_retries: config.max_retries.unwrap_or(DEFAULT_MAX_RETRIES),
            max_wait: Duration::from_millis(
                config
                    .max_retry_wait_ms
                    .unwrap_or(DEFAULT_MAX_RETRY_WAIT_MS),
            ),
            ..CallRetry::default()
        };
        Ok(LlmClient {
            concurrency: AdaptiveLimiter::new(
                config.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY),
            ),
            config,
            key,
            http,
            cache: Arc::new(NoCache),
            rate: Arc::new(Unlimited),
            retry,
            mode: AtomicU8::new(StructuredMode::JsonSchema as u8),
            requests: AtomicU64::new(0),
            rate_limited: AtomicU64::new(0),
        })
    }

    pub fn with_cache(mut self, cache: Arc<dyn ResponseCache>) -> Self {
        self.cache = cache;
        self
    }

    pub fn with_rate_limiter(mut self, rate: Arc<dyn RateLimiter>) -> Self {
        self.rate = rate;
        self
    }

    pub fn with_retry(mut self, retry: CallRetry) -> Self {
        self.retry = retry;
        self
    }

    pub fn config(&self) -> &ProviderConfig {
        &self.config
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// HTTP requests sent so far (retries and fallbacks included).
    pub fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// HTTP 429 answers so far (each retried or handed up as a transient fault).
    pub fn rate_limited(&self) -> u64 {
        self.rate_limited.load(Ordering::Relaxed)
    }

    /// The current adaptive concurrency limit.
    pub fn concurrency_limit(&self) -> usize {
        self.concurrency.limit()
    }

    /// Sends a chat request (or serves it from the cache).
    pub async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, Fault> {
        self.chat_accepting(req, |_| true).await
    }

    /// Like [`LlmClient::chat`], but stores the answer in the cache only when `accept` says it
    /// is usable (a judge answer that does not parse must not be served again).
    #[tracing::instrument(skip_all, fields(provider = %self.config.name, model = %self.config.model))]
    pub async fn chat_accepting(
        &self,
        req: &ChatRequest,
        accept: impl Fn(&ChatResponse) -> bool + Send + Sync,
    ) -> Result<ChatResponse, Fault> {
        let key = self.chat_cache_key(req);
        if let Some(hit) = self.cache.get(&key).await {
            if let Ok(mut resp) = serde_json::from_value::<ChatResponse>(hit) {
                resp.cached = true;
                resp.usage = Usage::default();
                tracing::debug!("model response served from the cache");
                return Ok(resp);
            }
        }
        let estimate = estimate_tokens(req, self.config.max_tokens);
        let resp = self
            .with_retries(
                estimate,
                |resp: &ChatResponse| resp.usage.total_tokens(),
                || self.send_chat(req),
            )
            .await?;
        if accept(&resp) {
            if let Ok(v) = serde_json::to_value(&resp) {
                self.cache.put(&key, &v).await;
            }
        }
        Ok(resp)
    }

    /// One turn of a tool-using agent, in the provider's native tool-use protocol (see
    /// [`super::tools`]). Never cached: each turn depends on what the tools did.
    #[tracing::instrument(skip_all, fields(provider = %self.config.name, model = %self.config.model))]
    pub async fn agent_turn(
        &self,
        req: &super::tools::AgentRequest,
    ) -> Result<(super::tools::AgentReply, Usage), Fault> {
        let chars: usize = req.system.len()
            + req
                .messages
                .iter()
                .map(|m| match m {
                    super::tools::AgentMessage::User(t) => t.len(),
                    super::tools::AgentMessage::Assistant { text, .. } => text.len() + 64,
                    super::tools::AgentMessage::ToolResults(r) => {
                        r.iter().map(|x| x.content.len()).sum()
                    }
                })
                .sum::<usize>();
        let estimate = token_estimate(chars, req.max_tokens, self.config.max_tokens);
        let reply = self
            .with_retries(
                estimate,
                |r: &super::tools::AgentReply| r.input_tokens + r.output_tokens,
                || self.send_agent_turn(req),
            )
            .await?;
        let usage = self.config.usage(reply.input_tokens, reply.output_tokens);
        Ok((reply, usage))
    }

    async fn send_agent_turn(
        &self,
        req: &super::tools::AgentRequest,
    ) -> Result<(super::tools::AgentReply, bool), SendError> {
        let temperature = self.config.temperature;
        let (path, body) = match self.config.kind {
            ProviderKind::Anthropic => (
                "messages",
                super::tools::anthropic_body(&self.config, req, temperature),
            ),
            ProviderKind::Openai => (
                "chat/completions",
                super::tools::openai_body(&self.config, req, temperature),
            ),
        };
        let answer = self.post(path, &body).await?;
        let parsed = match self.config.kind {
            ProviderKind::Anthropic => super::tools::parse_anthropic(&answer.body),
            ProviderKind::Openai => super::tools::parse_openai(&answer.body),
        }
        .map_err(|p| SendError::shape(&self.config.name, "tool-use", &p))?;
        Ok((parsed, answer.headroom_low))
    }

    /// Embeds texts with the provider's `embedding_model`; each vector is cached on its own.
    #[tracing::instrument(skip_all, fields(provider = %self.config.name, texts = texts.len()))]
    pub async fn embed(&self, texts: &[&str]) -> Result<Embeddings, Fault> {
        let Some(model) = self.config.embedding_model.clone() else {
            return Err(Fault::permanent(format!(
                "provider `{}` has no `embedding_model`; set one (e.g. text-embedding-3-small, nomic-embed-text) or point `embeddings` at a provider that has",
                self.config.name
            )));
        };
        if self.config.kind == ProviderKind::Anthropic {
            return Err(Fault::permanent(format!(
                "provider `{}` is an Anthropic provider, which has no embeddings API; point `embeddings` at an OpenAI-compatible provider",
                self.config.name
            )));
        }
        let keys: Vec<String> = texts
            .iter()
            .map(|t| {
                cache_key(&json!({
                    "kind": "embedding",
                    "provider": self.config.name,
                    "base_url": self.config.base_url(),
                    "model": model,
                    "input": t,
                }))
            })
            .collect();
        let mut vectors: Vec<Option<Vec<f32>>> = Vec::with_capacity(texts.len());
        for key in &keys {
            let hit = self
                .cache
                .get(key)
                .await
                .and_then(|v| serde_json::from_value::<Vec<f32>>(v).ok());
            vectors.push(hit);
        }
        let missing: Vec<usize> = (0..texts.len()).filter(|i| vectors[*i].is_none()).collect();
        let mut usage = Usage::default();
        if !missing.is_empty() {
            let inputs: Vec<&str> = missing.iter().map(|i| texts[*i]).collect();
            let estimate = inputs.iter().map(|t| t.len() as u64 / 4 + 1).sum();
            let (fresh, used) = self
                .with_retries(
                    estimate,
                    |(_, u): &(Vec<Vec<f32>>, Usage)| u.total_tokens(),
                    || self.send_embeddings(&model, &inputs),
                )
                .await?;
            usage = used;
            for (i, vector) in missing.iter().zip(fresh) {
                if let Ok(v) = serde_json::to_value(&vector) {
                    self.cache.put(&keys[*i], &v).await;
                }
                vectors[*i] = Some(vector);
            }
        }
        Ok(Embeddings {
            vectors: vectors.into_iter().map(Option::unwrap_or_default).collect(),
            usage,
            model,
            cached: missing.is_empty(),
        })
    }

    fn chat_cache_key(&self, req: &ChatRequest) -> String {
        cache_key(&json!({
            "kind": "chat",
            "provider": self.config.name,
            "api": self.config.kind.as_str(),
            "base_url": self.config.base_url(),
            "model": self.config.model,
            "system": req.system,
            "messages": req.messages,
            "temperature": self.temperature(req),
            "max_tokens": req.max_tokens.unwrap_or(self.config.max_tokens),
            "schema": req.schema,
            "salt": req.cache_salt,
        }))
    }

    fn temperature(&self, req: &ChatRequest) -> Option<f64> {
        req.temperature.or(self.config.temperature)
    }

    /// Runs `send` under the limits, retrying transient faults (see the module docs).
    async fn with_retries<T, S, F, Fut>(
        &self,
        estimate: u64,
        tokens_of: S,
        mut send: F,
    ) -> Result<T, Fault>
    where
        S: Fn(&T) -> u64,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(T, bool), SendError>>,
    {
        let name = self.config.name.as_str();
        let mut retry = 0u32;
        loop {
            self.rate.acquire(name, estimate).await;
            let outcome = {
                let _permit = self.concurrency.acquire().await;
                send().await
            };
            match outcome {
                Ok((value, headroom_low)) => {
                    // Exhausted rate-limit headers: hold the limit where it is.
                    if !headroom_low {
                        self.concurrency.on_success();
                    }
                    self.rate.record(name, estimate, tokens_of(&value));
                    return Ok(value);
                }
                Err(SendError { fault, status }) => {
                    self.rate.record(name, estimate, 0);
                    if status == Some(429) {
                        self.rate_limited.fetch_add(1, Ordering::Relaxed);
                        self.concurrency.on_overload();
                    }
                    if !fault.is_transient() {
                        return Err(fault);
                    }
                    if retry >= self.retry.max_retries {
                        return Err(after_attempts(fault, retry + 1));
                    }
                    retry += 1;
                    let wait = self.retry.delay(retry, &fault);
                    if wait > self.retry.max_wait {
                        tracing::warn!(provider = name, ?wait, "the provider asks for a longer wait than max_retry_wait_ms; handing the fault up");
                        return Err(fault);
                    }
                    tracing::info!(provider = name, retry, ?wait, error = %fault, "transient provider fault; waiting before retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// One chat exchange, falling back through the structured-output forms a server rejects.
    async fn send_chat(&self, req: &ChatRequest) -> Result<(ChatResponse, bool), SendError> {
        let temperature = self.temperature(req);
        if self.config.kind == ProviderKind::Anthropic {
            let body = anthropic::messages_body(&self.config, req, temperature);
            let answer = self.post("messages", &body).await?;
            let tool = req.schema.as_ref().map(|s| s.name.as_str());
            let (parsed, structured) = anthropic::parse_messages(&answer.body, tool)
                .map_err(|p| SendError::shape(&self.config.name, "Messages", &p))?;
            return Ok((self.response(parsed, structured), answer.headroom_low));
        }
        let remembered = StructuredMode::from_u8(self.mode.load(Ordering::Relaxed));
        let mut mode = remembered;
        loop {
            let body = openai::chat_body(&self.config, req, temperature, mode);
            match self.post("chat/completions", &body).await {
                Ok(answer) => {
                    if mode != remembered {
                        tracing::info!(provider = %self.config.name, ?mode, "the provider rejected a structured-output form; using this one from now on");
                        self.mode.store(mode as u8, Ordering::Relaxed);
                    }
                    let parsed = openai::parse_chat(&answer.body)
                        .map_err(|p| SendError::shape(&self.config.name, "chat-completions", &p))?;
                    return Ok((self.response(parsed, None), answer.headroom_low));
                }
                Err(e) if e.status == Some(400) && req.schema.is_some() => match mode.fallback() {
                    Some(next) => {
                        tracing::debug!(provider = %self.config.name, ?mode, error = %e.fault, "HTTP 400 with this response_format; trying a simpler one");
                        mode = next;
                    }
                    None => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
    }

    fn response(&self, parsed: openai::ParsedChat, structured: Option<Value>) -> ChatResponse {
        ChatResponse {
            text: parsed.text,
            structured,
            usage: self.config.usage(parsed.input_tokens, parsed.output_tokens),
            truncated: parsed.truncated,
            model: if parsed.model.is_empty() {
                self.config.model.clone()
            } else {
                parsed.model
            },
            cached: false,
        }
    }

    async fn send_embeddings(
        &self,
        model: &str,
        inputs: &[&str],
    ) -> Result<((Vec<Vec<f32>>, Usage), bool), SendError> {
        let body = openai::embeddings_body(model, inputs);
        let answer = self.post("embeddings", &body).await?;
        let (vectors, tokens) = openai::parse_embeddings(&answer.body, inputs.len())
            .map_err(|p| SendError::shape(&self.config.name, "embeddings", &p))?;
        Ok(((vectors, self.config.usage(tokens, 0)), answer.headroom_low))
    }

    /// POSTs JSON to `{base_url}/{path}` with the provider's authentication.
    async fn post(&self, path: &str, body: &Value) -> Result<Answer, SendError> {
        let name = self.config.name.as_str();
        let url = format!("{}/{path}", self.config.base_url());
        let mut request = self.http.post(&url).json(body);
        match self.config.kind {
            ProviderKind::Openai => {
                if let Some(key) = &self.key {
                    request = request.bearer_auth(key.expose());
                }
            }
            ProviderKind::Anthropic => {
                request = request.header("anthropic-version", ANTHROPIC_VERSION);
                if let Some(key) = &self.key {
                    request = request.header("x-api-key", key.expose());
                }
            }
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let secret = self.key.as_ref().map(ApiKey::expose);
        let transport = |e: reqwest::Error| SendError {
            fault: redact_fault(
                fault_from_transport(name, &e, self.config.timeout_ms),
                secret,
            ),
            status: None,
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.map_err(transport)?;
        if !(200..300).contains(&status) {
            let fault = fault_from_status(name, status, &headers, &text, chrono::Utc::now());
            return Err(SendError {
                fault: redact_fault(fault, secret),
                status: Some(status),
            });
        }
        let body = serde_json::from_str::<Value>(&text).map_err(|e| SendError {
            fault: Fault::transient(format!(
                "provider `{name}` answered HTTP {status} with a body that is not JSON: {e}"
            )),
            status: Some(status),
        })?;
        let exhausted = |h: &str| {
            headers
                .get(h)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim() == "0")
        };
        Ok(Answer {
            body,
            headroom_low: exhausted("x-ratelimit-remaining-requests")
                || exhausted("anthropic-ratelimit-requests-remaining"),
        })
    }
}

/// Tokens a request may use, for the budget's reservation (see [`token_estimate`]).
fn estimate_tokens(req: &ChatRequest, default_max: u32) -> u64 {
    let chars: usize = req.system.as_deref().map_or(0, str::len)
        + req.messages.iter().map(|m| m.content.len()).sum::<usize>();
    token_estimate(chars, req.max_tokens, default_max)
}

/// About a token per four characters of input, plus the output cap (the request's, else the
/// provider's).
fn token_estimate(input_chars: usize, max_tokens: Option<u32>, default_max: u32) -> u64 {
    input_chars as u64 / 4 + u64::from(max_tokens.unwrap_or(default_max))
}

fn redact_fault(fault: Fault, secret: Option<&str>) -> Fault {
    match fault {
        Fault::Transient {
            message,
            retry_after_ms,
        } => Fault::Transient {
            message: redact(&message, secret),
            retry_after_ms,
        },
        Fault::Permanent { message } => Fault::Permanent {
            message: redact(&message, secret),
        },
        other => other,
    }
}

fn after_attempts(fault: Fault, attempts: u32) -> Fault {
    match fault {
        Fault::Transient {
            message,
            retry_after_ms,
        } => Fault::Transient {
            message: format!("{message} (gave up after {attempts} attempts)"),
            retry_after_ms,
        },
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn call_retry_grows_and_honours_retry_after() {
        let r = CallRetry::default();
        let f = Fault::transient("x");
        let d1 = r.delay(1, &f);
        assert!(
            d1 >= Duration::from_millis(250) && d1 <= Duration::from_millis(500),
            "{d1:?}"
        );
        let d3 = r.delay(3, &f);
        assert!(
            d3 >= Duration::from_millis(1_000) && d3 <= Duration::from_millis(2_000),
            "{d3:?}"
        );
        let asked = Fault::Transient {
            message: "429".into(),
            retry_after_ms: Some(2_000),
        };
        assert!(r.delay(1, &asked) >= Duration::from_secs(2));
        // Above the backoff, what was asked and no more (the llm runner's 429 test waits it).
        assert_eq!(r.delay(1, &asked), Duration::from_secs(2));
        assert!(r.delay(40, &f) <= r.max_delay);
    }

    #[test]
    fn debug_hides_the_key() {
        let c = LlmClient::new(
            ProviderConfig::new("p", ProviderKind::Openai, "m"),
            Some(ApiKey::new("sk-very-secret")),
        )
        .unwrap();
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("sk-very-secret") && shown.contains("<redacted>"),
            "{shown}"
        );
    }
}
