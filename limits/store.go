package limits

import (
	"context"
	"errors"
	"time"
)

// Check is one rule's part of a decision: which key, which algorithm and
// limits, and how much this request costs.
type Check struct {
	Key       string
	Algorithm Algorithm
	Limit     int64
	// PeriodUS is the period in microseconds.
	PeriodUS int64
	Burst    int64
	Cost     int64
	Shadow   bool
}

// Result is a store's verdict for one Check.
//
// Example, fixed_window limit 5 per 60 s, third request 20 s into the window:
// Allowed=true, Remaining=2, ResetUS=40_000_000, RetryUS=0.
type Result struct {
	// Allowed is this rule's own verdict. A shadow rule can report false
	// while the request as a whole is admitted.
	Allowed bool
	// Remaining is the quota left after this request (or, when the request
	// as a whole was denied, the quota left without it: nothing was consumed).
	Remaining int64
	// ResetUS is the time in microseconds until the quota is fully back.
	ResetUS int64
	// RetryUS is the time in microseconds until this request's cost would be
	// admitted; 0 when allowed, NeverFits when the cost exceeds the burst.
	RetryUS int64
}

// NeverFits is the RetryUS of a request whose cost can never be admitted.
const NeverFits int64 = -1

// Batch is everything one request asks a store, decided all-or-nothing.
type Batch struct {
	Checks []Check
	// NowUS, when non-zero, replaces the store's clock (microseconds since
	// the epoch). Only tests set it; production calls leave it zero so the
	// store's own clock (Redis TIME) decides.
	NowUS int64
}

// Store decides batches atomically. Decide fills results (len(results) ==
// len(b.Checks)) and reports whether the request is admitted: it is admitted
// only if every non-shadow check allows it, and only then is anything
// consumed. A check that would deny never consumes, shadow or not.
type Store interface {
	Decide(ctx context.Context, b *Batch, results []Result) (admitted bool, err error)
	// Peek reports the state of one check's key without consuming (cost is
	// ignored and treated as zero).
	Peek(ctx context.Context, c Check) (Result, error)
	// Reset deletes one check's key.
	Reset(ctx context.Context, c Check) error
	// Ping reports whether the store answers.
	Ping(ctx context.Context) error
	// Name describes the store for logs and /readyz ("redis 127.0.0.1:6379", "memory").
	Name() string
	Close() error
}

// PeriodUS converts a period to microseconds.
func PeriodUS(d time.Duration) int64 { return int64(d / time.Microsecond) }

// ErrShortResults is returned by a store's Decide when the results slice is
// shorter than the batch's checks.
var ErrShortResults = errors.New("store: results slice shorter than checks")
