package redisstore

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rategate/rategate/limits"

	"github.com/redis/go-redis/v9"
)

// Info is the Redis health rategate exports, read from INFO. On Redis
// Cluster the values are summed over the primaries.
type Info struct {
	// Up is false when the last INFO failed; the other fields then keep
	// their last known values.
	Up               bool
	UsedMemory       int64
	MaxMemory        int64
	ConnectedClients int64
	OpsPerSec        int64
	EvictedKeys      int64
	ExpiredKeys      int64
}

// infoFields maps INFO fields to where they go.
var infoFields = map[string]func(*Info) *int64{
	"used_memory":               func(r *Info) *int64 { return &r.UsedMemory },
	"maxmemory":                 func(r *Info) *int64 { return &r.MaxMemory },
	"connected_clients":         func(r *Info) *int64 { return &r.ConnectedClients },
	"instantaneous_ops_per_sec": func(r *Info) *int64 { return &r.OpsPerSec },
	"evicted_keys":              func(r *Info) *int64 { return &r.EvictedKeys },
	"expired_keys":              func(r *Info) *int64 { return &r.ExpiredKeys },
}

// ParseInfo adds the fields rategate exports from one INFO reply to r.
func ParseInfo(text string, r *Info) {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		f := infoFields[k]
		if f == nil {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			*f(r) += n
		}
	}
}

// ReadInfo runs INFO memory clients stats (on every primary of a cluster)
// and returns the parsed values.
func (s *Store) ReadInfo(ctx context.Context) (Info, error) {
	return readRedisInfo(ctx, s.Client())
}

func readRedisInfo(ctx context.Context, c redis.UniversalClient) (Info, error) {
	var info Info
	if cc, ok := c.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			text, err := n.Info(ctx, "memory", "clients", "stats").Result()
			if err != nil {
				return err
			}
			mu.Lock()
			ParseInfo(text, &info)
			mu.Unlock()
			return nil
		})
		if err != nil {
			return Info{}, err
		}
		info.Up = true
		return info, nil
	}
	text, err := c.Info(ctx, "memory", "clients", "stats").Result()
	if err != nil {
		return Info{}, err
	}
	ParseInfo(text, &info)
	info.Up = true
	return info, nil
}

// PollInfo reads INFO now and then every interval until ctx ends, each read
// with its own deadline of timeout, and hands every result to report (Up
// false when the read failed).
func (s *Store) PollInfo(ctx context.Context, every, timeout time.Duration, report func(Info, error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, timeout)
		info, err := s.ReadInfo(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		report(info, err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ErrorKind classifies a Redis store error for operators:
//
//   - timeout: the deadline passed (context.DeadlineExceeded, an I/O
//     timeout, go-redis's pool timeout);
//   - connection: Redis could not be reached or used (refused, reset,
//     EOF, closed client, DNS; a cluster primary whose own breaker is
//     open; and the server-state replies LOADING, MASTERDOWN, READONLY,
//     NOAUTH, WRONGPASS, NOPERM);
//   - cluster: Redis Cluster redirections and outages (MOVED, ASK,
//     CLUSTERDOWN, TRYAGAIN, CROSSSLOT);
//   - oom: OOM (maxmemory reached with a no-eviction policy: Redis refuses
//     writes, so decisions fail until memory is freed);
//   - script: any other Redis error reply (ERR, NOSCRIPT, BUSY, a script
//     runtime error) or a reply of the wrong shape;
//   - other: anything else (context.Canceled, a bug).
func ErrorKind(err error) limits.ErrorKind {
	if _, ok := errors.AsType[*primaryDown](err); ok {
		return limits.KindConnection // its primary's breaker is open: unusable
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.Is(err, redis.ErrPoolTimeout), errors.As(err, &ne) && ne.Timeout():
		return limits.KindTimeout
	}
	var re redis.Error
	if errors.As(err, &re) && !errors.Is(err, redis.Nil) {
		msg := re.Error()
		word, _, _ := strings.Cut(msg, " ")
		switch word {
		case "MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "CROSSSLOT":
			return limits.KindCluster
		case "LOADING", "MASTERDOWN", "READONLY", "NOAUTH", "WRONGPASS", "NOPERM":
			return limits.KindConnection
		case "OOM":
			return limits.KindOOM
		}
		// A script's redis.call that hit maxmemory comes back wrapped in
		// the script's error text.
		if strings.Contains(msg, "OOM command not allowed") {
			return limits.KindOOM
		}
		return limits.KindScript
	}
	var oe *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &oe), errors.As(err, &dnsErr),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, redis.ErrClosed):
		return limits.KindConnection
	}
	if strings.Contains(err.Error(), "redis store: reply") {
		// parseDecideReply: the script answered something of the wrong shape.
		return limits.KindScript
	}
	return limits.KindOther
}
