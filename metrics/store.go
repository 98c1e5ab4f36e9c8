package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/limits"
)

// Store operations, as the rategate_store_* op label.
const (
	opDecide = iota
	opPeek
	opReset
	opPing
	opRaw
	numOps
)

var opNames = [numOps]string{"decide", "peek", "reset", "ping", "raw"}

// Error kinds, as the rategate_store_errors_total kind label.
const (
	KindTimeout    = "timeout"
	KindConnection = "connection"
	KindScript     = "script"
	KindCluster    = "cluster"
	KindOther      = "other"
)

const (
	kindTimeout = iota
	kindConnection
	kindScript
	kindCluster
	kindOther
	numKinds
)

var kindNames = [numKinds]string{KindTimeout, KindConnection, KindScript, KindCluster, KindOther}

// ErrorKind classifies a store error for operators:
//
//   - timeout: the deadline passed (context.DeadlineExceeded, an I/O
//     timeout, go-redis's pool timeout);
//   - connection: Redis could not be reached or used (refused, reset,
//     EOF, closed client, DNS; and the server-state replies LOADING,
//     MASTERDOWN, READONLY, NOAUTH, WRONGPASS, NOPERM);
//   - cluster: Redis Cluster redirections and outages (MOVED, ASK,
//     CLUSTERDOWN, TRYAGAIN, CROSSSLOT);
//   - script: any other Redis error reply (ERR, NOSCRIPT, BUSY, OOM, a
//     script runtime error) or a reply of the wrong shape;
//   - other: anything else (context.Canceled, a bug).
func ErrorKind(err error) string { return kindNames[errorKind(err)] }

func errorKind(err error) int {
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.Is(err, redis.ErrPoolTimeout), errors.As(err, &ne) && ne.Timeout():
		return kindTimeout
	}
	var re redis.Error
	if errors.As(err, &re) && !isClientError(err) {
		msg := re.Error()
		word, _, _ := strings.Cut(msg, " ")
		switch word {
		case "MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "CROSSSLOT":
			return kindCluster
		case "LOADING", "MASTERDOWN", "READONLY", "NOAUTH", "WRONGPASS", "NOPERM":
			return kindConnection
		}
		return kindScript
	}
	var oe *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &oe), errors.As(err, &dnsErr),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, redis.ErrClosed):
		return kindConnection
	}
	if strings.Contains(err.Error(), "redis store: reply") {
		// parseDecideReply: the script answered something of the wrong shape.
		return kindScript
	}
	return kindOther
}

// isClientError reports go-redis errors that satisfy redis.Error without
// being a server reply (redis.Nil is one; it never reaches here from the
// store, but it is not a script error either).
func isClientError(err error) bool { return errors.Is(err, redis.Nil) }

// InstrumentStore wraps s so every call is timed into
// rategate_store_duration_seconds{op} and every error counted into
// rategate_store_errors_total{op,kind}. The wrapper keeps s's optional
// limits.Inspector. Unwrap returns s.
func InstrumentStore(s limits.Store, m *Metrics) limits.Store {
	in := instrumented{s: s, m: m}
	if i, ok := s.(limits.Inspector); ok {
		return &inspectingStore{instrumented: in, i: i}
	}
	return &in
}

// Unwrap returns the store inside an InstrumentStore wrapper, or s itself.
func Unwrap(s limits.Store) limits.Store {
	if u, ok := s.(interface{ Unwrap() limits.Store }); ok {
		return u.Unwrap()
	}
	return s
}

type instrumented struct {
	s limits.Store
	m *Metrics
}

func (w *instrumented) done(op int, start time.Time, err error) {
	w.m.storeDur[op].Observe(time.Since(start))
	if err != nil {
		w.m.storeErrors[op][errorKind(err)].Add(1)
	}
}

func (w *instrumented) Decide(ctx context.Context, b *limits.Batch, results []limits.Result) (bool, error) {
	start := time.Now()
	ok, err := w.s.Decide(ctx, b, results)
	w.done(opDecide, start, err)
	return ok, err
}

func (w *instrumented) Peek(ctx context.Context, c limits.Check) (limits.Result, error) {
	start := time.Now()
	r, err := w.s.Peek(ctx, c)
	w.done(opPeek, start, err)
	return r, err
}

func (w *instrumented) Reset(ctx context.Context, c limits.Check) error {
	start := time.Now()
	err := w.s.Reset(ctx, c)
	w.done(opReset, start, err)
	return err
}

func (w *instrumented) Ping(ctx context.Context) error {
	start := time.Now()
	err := w.s.Ping(ctx)
	w.done(opPing, start, err)
	return err
}

func (w *instrumented) Name() string         { return w.s.Name() }
func (w *instrumented) Close() error         { return w.s.Close() }
func (w *instrumented) Unwrap() limits.Store { return w.s }

type inspectingStore struct {
	instrumented
	i limits.Inspector
}

func (w *inspectingStore) Raw(ctx context.Context, key string) (limits.RawValue, error) {
	start := time.Now()
	v, err := w.i.Raw(ctx, key)
	w.done(opRaw, start, err)
	return v, err
}
