package limits

import "fmt"

// FailureMode says what a request gets when the shared store is down (its
// circuit breaker is open, or it fails and no local decision is possible).
// It never applies to a single failed or slow decision while the store is
// up: that request is decided by the local fallback store, so no caller can
// turn a slow decision into an admission.
type FailureMode uint8

// The failure modes, as written in the config file.
const (
	// FailAllow admits the request undecided (204 with
	// X-RateLimit-Status: unavailable). The default.
	FailAllow FailureMode = iota
	// FailDeny refuses it undecided (503).
	FailDeny
	// FailLocal decides it with the per-process fallback store, every limit
	// divided by local_share.
	FailLocal
)

// FailureModes lists the modes in their numeric order.
var FailureModes = []FailureMode{FailAllow, FailDeny, FailLocal}

// String returns the mode as written in the config file: allow, deny, local.
func (m FailureMode) String() string {
	switch m {
	case FailAllow:
		return "allow"
	case FailDeny:
		return "deny"
	case FailLocal:
		return "local"
	}
	return fmt.Sprintf("FailureMode(%d)", uint8(m))
}

// ParseFailureMode reads allow, deny or local.
func ParseFailureMode(s string) (FailureMode, bool) {
	for _, m := range FailureModes {
		if m.String() == s {
			return m, true
		}
	}
	return FailAllow, false
}

// RejectReason says why a request could not even be asked about: the
// identity NGINX sent is incomplete or invalid (the handler answers 400).
type RejectReason uint8

// The reasons. The handler checks RejectTrailer first, then the others
// in this order.
const (
	// RejectMissingURI: neither the URI header nor the URL header is set.
	RejectMissingURI RejectReason = iota
	// RejectIP: no valid client IP in the IP header.
	RejectIP
	// RejectCost: the cost header is not an integer from 1 to max_cost.
	RejectCost
	// RejectDuplicateHeader: a header a rule reads (a header key dimension
	// or a match on a header) was sent more than once.
	RejectDuplicateHeader
	// RejectTrailer: the request carried trailer fields (after a chunked
	// body), where a client could write a header no proxy replaces.
	RejectTrailer
	// NumRejectReasons is the number of reasons, for arrays indexed by them.
	NumRejectReasons
)

// String returns the reason as a metric label: missing_uri, invalid_ip,
// invalid_cost, duplicate_header, trailer.
func (r RejectReason) String() string {
	switch r {
	case RejectMissingURI:
		return "missing_uri"
	case RejectIP:
		return "invalid_ip"
	case RejectCost:
		return "invalid_cost"
	case RejectDuplicateHeader:
		return "duplicate_header"
	case RejectTrailer:
		return "trailer"
	}
	return "unknown"
}

// ErrorKind sorts store errors for operators (the kind label of
// rategate_store_errors_total). The Redis store classifies its errors
// (redis.ErrorKind); the domain only names the kinds.
type ErrorKind uint8

// The error kinds.
const (
	// KindTimeout: the deadline passed.
	KindTimeout ErrorKind = iota
	// KindConnection: the store could not be reached or used.
	KindConnection
	// KindScript: the store answered with an error (a script error, a reply
	// of the wrong shape).
	KindScript
	// KindCluster: Redis Cluster redirections and outages.
	KindCluster
	// KindOOM: Redis is out of memory (maxmemory reached, noeviction).
	KindOOM
	// KindOther: anything else (a caller that gave up, a bug).
	KindOther
	// NumErrorKinds is the number of kinds, for arrays indexed by them.
	NumErrorKinds
)

// String returns the kind as a metric label.
func (k ErrorKind) String() string {
	switch k {
	case KindTimeout:
		return "timeout"
	case KindConnection:
		return "connection"
	case KindScript:
		return "script"
	case KindCluster:
		return "cluster"
	case KindOOM:
		return "oom"
	}
	return "other"
}
