package config

import "time"

// This file holds the governance schema: gateway keys, teams, their limits,
// model prices, the spend ledger, Redis and the admin API.

// Limits are the optional limits of a [[teams]] or [[keys]] table. A key left
// out (nil) means no limit; a key written out must be > 0 (a limit of 0 would
// refuse every request: leave the key out instead).
type Limits struct {
	// RPM is requests per minute (a token bucket: bursts up to RPM, refilled
	// continuously at RPM/60 per second).
	RPM *int64 `toml:"rpm" json:"rpm,omitempty"`
	// TPM is tokens per minute, input plus output. Admission reserves the
	// prompt estimate plus max_tokens (or [ratelimit] default_max_tokens) and
	// the real usage replaces the estimate when the request ends.
	TPM *int64 `toml:"tpm" json:"tpm,omitempty"`
	// Concurrency is the number of requests open at once.
	Concurrency *int64 `toml:"concurrency" json:"concurrency,omitempty"`
	// TokensPerDay is a budget of tokens per UTC day, input plus output.
	TokensPerDay *int64 `toml:"tokens_per_day" json:"tokens_per_day,omitempty"`
	// CostPerDayUSD is a budget in US dollars per UTC day, priced by [[models]].
	CostPerDayUSD *float64 `toml:"cost_per_day_usd" json:"cost_per_day_usd,omitempty"`
	// CostPerMonthUSD is a budget in US dollars per UTC calendar month.
	CostPerMonthUSD *float64 `toml:"cost_per_month_usd" json:"cost_per_month_usd,omitempty"`
	// CountTokensRPM is token counts per minute (POST
	// /v1/messages/count_tokens, POST /v1/responses/input_tokens), a
	// bucket of their own: a token count is
	// never billed and takes nothing from RPM, TPM or the budgets (IDE
	// extensions send tens a second at start).
	CountTokensRPM *int64 `toml:"count_tokens_rpm" json:"count_tokens_rpm,omitempty"`
}

// Team is one [[teams]] table.
type Team struct {
	// Name identifies the team in logs, metrics ("team" label) and the admin
	// API: a-z, 0-9, _ and -, unique, not "none" (the label value of
	// requests without a team). Required.
	Name string `toml:"name"`
	// Models, when not empty, limits the team to models matching one of these
	// patterns; each must be the pattern of a [[models]] table, so every model
	// a team may use has a price. Empty: any model.
	Models []string `toml:"models"`
	Limits
	// MaxCostPerConversationUSD is a budget in US dollars per conversation
	// ([conversations] must be on): a turn whose cost, estimated as for the
	// other budgets, would take its conversation past it is refused.
	MaxCostPerConversationUSD *float64 `toml:"max_cost_per_conversation_usd"`
	// ClassRPM caps the team's requests per minute of a request class, as
	// a coding agent names it (llm.RequestClasses: main, subagent,
	// workflow, compaction, auxiliary, warmup, other), each a bucket of its
	// own on top of the team's rpm: a class capped cannot take the whole
	// team's rate (auxiliary calls starving main turns). Optional.
	ClassRPM map[string]int64 `toml:"class_rpm"`
}

// Key is one [[keys]] table: a gateway key (mode "keys"), or in mode
// "passthrough" a caller's own key given a name, a team and limits.
type Key struct {
	// Name identifies the key in logs, metrics and the admin API (never the
	// key itself): a-z, 0-9, _ and -, unique, not "none". Required.
	Name string `toml:"name" json:"name"`
	// SHA256 is the lowercase hex SHA-256 of the key, as printed by
	// `gateway hash-key`. Required, unique. The file may use uppercase;
	// Parse lowercases it.
	SHA256 string `toml:"sha256" json:"sha256"`
	// Team is the name of the [[teams]] table the key belongs to. Optional.
	Team string `toml:"team" json:"team,omitempty"`
	Limits
}

// Model is one [[models]] table: the price of the models matching Pattern.
// Prices are US dollars per million tokens. Input is the price of prompt
// tokens that are neither cache reads nor cache writes; reasoning tokens are
// output tokens and priced as such.
type Model struct {
	// Pattern matches model names, as path.Match does ("gpt-4o*",
	// "claude-sonnet-4-*"). The first [[models]] table that matches a
	// request's model prices it. Required, unique.
	Pattern string `toml:"pattern"`
	// InputUSDPerMTok prices uncached prompt tokens. Required, >= 0.
	InputUSDPerMTok float64 `toml:"input_usd_per_mtok"`
	// OutputUSDPerMTok prices output tokens (reasoning included). Required, >= 0.
	OutputUSDPerMTok float64 `toml:"output_usd_per_mtok"`
	// CacheReadUSDPerMTok prices prompt tokens read from the cache. Optional;
	// left out, they cost the input price.
	CacheReadUSDPerMTok *float64 `toml:"cache_read_usd_per_mtok"`
	// CacheWriteUSDPerMTok prices prompt tokens written to the cache.
	// Optional; left out, they cost the input price.
	CacheWriteUSDPerMTok *float64 `toml:"cache_write_usd_per_mtok"`
}

// RateLimit is the [ratelimit] table.
type RateLimit struct {
	// DefaultMaxTokens is the output reserved against TPM and token budgets
	// for a request that sets no max_tokens (or max_completion_tokens).
	// Default 4096.
	DefaultMaxTokens int64 `toml:"default_max_tokens"`
	// OnRedisError says what happens when Redis cannot be reached: "allow"
	// (admit with an in-process limiter holding the same limits, per
	// replica) or "deny" (refuse with 503). Default "allow".
	OnRedisError string `toml:"on_redis_error"`
	// RedisRetrySeconds is how long, after a Redis error, the gateway uses the
	// fallback before trying Redis again. Default 1.
	RedisRetrySeconds float64 `toml:"redis_retry_seconds"`
}

// Redis is the [redis] table. With no addrs, limits and spend live in the
// process.
type Redis struct {
	// Addrs are host:port addresses: one for a single node, several for a
	// Cluster, or Sentinels when MasterName is set. Default [] (no Redis).
	Addrs []string `toml:"addrs"`
	// MasterName is the Sentinel master name. Default "".
	MasterName string `toml:"master_name"`
	// Username for Redis ACLs. Default "".
	Username string `toml:"username"`
	// PasswordEnv names the environment variable holding the password.
	// Default "" (no password).
	PasswordEnv string `toml:"password_env"`
	// Password is read from PasswordEnv at load time.
	Password Secret `toml:"-"`
	// DB is the database number (single node and Sentinel only). Default 0.
	DB int `toml:"db"`
	// TLS connects with TLS. Default false.
	TLS bool `toml:"tls"`
	// KeyPrefix starts every key tollgate writes. Non-empty, without { or }
	// (tollgate sets the Cluster hash tags). Default "tollgate:".
	KeyPrefix string `toml:"key_prefix"`
	// DialTimeoutMs bounds connecting. Default 500.
	DialTimeoutMs float64 `toml:"dial_timeout_ms"`
	// TimeoutMs bounds each command's read and write. Default 250.
	TimeoutMs float64 `toml:"timeout_ms"`
	// SpillDir is where a replica that stops while Redis is down keeps what
	// it could not send (spend, and rate-limit settlements and charges), in
	// tollgate-spend-spill.json and tollgate-ratelimit-spill.json; the next
	// start sends them. Each replica needs its own directory. "" drops them
	// at shutdown (logged). Default "." (the working directory).
	SpillDir string `toml:"spill_dir"`
}

// Spend is the [spend] table: the ledger of tokens and cost.
type Spend struct {
	// StateFile is where the in-process ledger is kept across restarts
	// (written atomically every FlushIntervalSeconds and on shutdown), with
	// every billed request appended to StateFile+".journal" before it
	// counts, so that a killed process loses none. "" keeps it in memory
	// only. Unused with Redis (see [redis] spill_dir). Default
	// "tollgate-spend.json".
	StateFile string `toml:"state_file"`
	// FlushIntervalSeconds is how often the state file is written, or with
	// Redis how often spend is sent to Redis. Default 2.
	FlushIntervalSeconds float64 `toml:"flush_interval_seconds"`
	// JournalSyncMs is how often the journal is fsynced when written since:
	// what a crash of the machine (not of the process) may lose. 0 syncs
	// it only when it is replaced (about once a minute) and at shutdown.
	// Default 100.
	JournalSyncMs float64 `toml:"journal_sync_ms"`
}

// Ownership is the [ownership] table: in mode "keys", which team (or key
// without a team) created each stored response and conversation of the
// upstream account the gateway's keys share, so that only it may use them.
type Ownership struct {
	// ResponseTTLHours is how long a response id's owner is kept: as long as
	// the upstream keeps the response. Default 720 (30 days, OpenAI's).
	ResponseTTLHours float64 `toml:"response_ttl_hours"`
	// ConversationTTLHours is how long a conversation id's owner is kept; 0
	// keeps it until the conversation is deleted through the gateway
	// (OpenAI keeps conversations without a time limit). Default 0.
	ConversationTTLHours float64 `toml:"conversation_ttl_hours"`
	// StateFile, without Redis, is the journal the owners are kept in across
	// restarts; "" keeps them in memory only. Unused with Redis, where the
	// owners are shared by every replica. Default "tollgate-ownership.jsonl".
	StateFile string `toml:"state_file"`
}

// ResponseTTL is ResponseTTLHours as a duration.
func (o *Ownership) ResponseTTL() time.Duration {
	return time.Duration(o.ResponseTTLHours * float64(time.Hour))
}

// ConversationTTL is ConversationTTLHours as a duration; 0 is no limit.
func (o *Ownership) ConversationTTL() time.Duration {
	return time.Duration(o.ConversationTTLHours * float64(time.Hour))
}

// Admin is the [admin] table: /admin/spend and /admin/limits.
type Admin struct {
	// TokenEnv names the environment variable holding the admin token,
	// presented as "Authorization: Bearer <token>"; its value must be at
	// least 16 characters. Unset, the admin API answers 404. Default "".
	TokenEnv string `toml:"token_env"`
	// Token is read from TokenEnv at load time.
	Token Secret `toml:"-"`
}
