package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// TestErrorKinds classifies errors from a real Redis, a real closed port
// and a real cluster-mode Redis without slots.
func TestErrorKinds(t *testing.T) {
	rs := testredis.Start(t)
	c := rs.Client(t)
	ctx := testredis.Ctx(t)

	_, scriptErr := c.Eval(ctx, "return redis.error_reply('ERR boom')", nil).Result()
	_, noScript := c.EvalSha(ctx, strings.Repeat("0", 40), nil).Result()
	_, runtimeErr := c.Eval(ctx, "return redis.call('INCR', KEYS[1], 'x')", []string{"k"}).Result()

	if err := c.Do(ctx, "CLIENT", "PAUSE", "400").Err(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, timeoutErr := c.Get(tctx, "k").Result()
	cancel()

	closed := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", testredis.FreePort(t)), DialerRetries: 1})
	defer closed.Close()
	refused := closed.Ping(ctx).Err()

	full := testredis.Start(t, "maxmemory 1", "maxmemory-policy noeviction")
	fc := full.Client(t)
	oomErr := fc.Set(ctx, "k", strings.Repeat("x", 1000), 0).Err()
	_, oomScript := fc.Eval(ctx, "return redis.call('SET', KEYS[1], ARGV[1])", []string{"k"}, strings.Repeat("x", 1000)).Result()

	cl := testredis.Start(t, "cluster-enabled yes")
	_, clusterDown := cl.Client(t).Get(ctx, "k").Result()

	for _, c := range []struct {
		err  error
		want limits.ErrorKind
	}{
		{scriptErr, limits.KindScript},
		{noScript, limits.KindScript},
		{runtimeErr, limits.KindScript},
		{fmt.Errorf("redis store: decide: %w", scriptErr), limits.KindScript},
		{errors.New("redis store: reply is string, want array"), limits.KindScript},
		{timeoutErr, limits.KindTimeout},
		{context.DeadlineExceeded, limits.KindTimeout},
		{refused, limits.KindConnection},
		{redis.ErrClosed, limits.KindConnection},
		{clusterDown, limits.KindCluster},
		{oomErr, limits.KindOOM},
		{oomScript, limits.KindOOM},
		{fmt.Errorf("redis store: decide: %w", oomScript), limits.KindOOM},
		{redis.ErrCrossSlot, limits.KindCluster},
		{redis.ErrPoolTimeout, limits.KindTimeout},
		{context.Canceled, limits.KindOther},
	} {
		if c.err == nil {
			t.Fatalf("expected an error for kind %s", c.want)
		}
		if got := ErrorKind(c.err); got != c.want {
			t.Errorf("ErrorKind(%v) = %s, want %s", c.err, got, c.want)
		}
		// the breakers' starvation guard excuses exactly these timeouts
		if got := IsTimeout(c.err); got != (c.want == limits.KindTimeout) {
			t.Errorf("IsTimeout(%v) = %v", c.err, got)
		}
	}
}

// TestRedisInfo reads INFO from a real Redis.
func TestRedisInfo(t *testing.T) {
	rs := testredis.Start(t, "maxmemory 10mb")
	c := rs.Client(t)
	info, err := readRedisInfo(testredis.Ctx(t), c)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Up || info.UsedMemory <= 0 || info.ConnectedClients < 1 || info.MaxMemory != 10<<20 {
		t.Fatalf("info %+v", info)
	}
	rs2 := testredis.Start(t)
	store, err := New(rs2.Client(t), "redis")
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan Info, 100)
	done := make(chan struct{})
	go func() {
		store.PollInfo(ctx, 20*time.Millisecond, time.Second, func(i Info, _ error) { reports <- i })
		close(done)
	}()
	if first := <-reports; !first.Up {
		t.Fatalf("first report %+v", first)
	}
	rs2.Stop()
	deadline := time.After(5 * time.Second)
	for down := false; !down; {
		select {
		case i := <-reports:
			down = !i.Up
		case <-deadline:
			t.Fatal("no report with Up false after Redis stopped")
		}
	}
	cancel()
	<-done
}
