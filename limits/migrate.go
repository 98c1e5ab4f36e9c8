package limits

import (
	"context"
	"fmt"
	"math/big"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/lua"
)

// This file keeps stored state sound when a rule's numbers change at run
// time (reload or override). Keys name the rule and the algorithm, not the
// numbers, so state written under the old numbers is read under the new
// ones. For every algorithm but one that is what it should be: window
// counts and logs keep counting, a token bucket keeps its level and refills
// at the new rate. gcra keeps a TAT, which can lie further ahead than the
// new tolerance allows when the tolerance shrinks (a period shortened from
// 1h to 1m leaves an hour-long TAT, and the identity would stay limited for
// that hour). ClampGCRA caps such TATs at now + the new tolerance.

// GCRATolerance returns tau = B*P/L of a gcra rule in whole microseconds,
// rounded down.
func GCRATolerance(r *Rule) int64 {
	x := new(big.Int).Mul(big.NewInt(r.Burst), big.NewInt(PeriodUS(r.Period)))
	return x.Quo(x, big.NewInt(r.Limit)).Int64()
}

// ToleranceShrank reports whether next, a gcra rule, tolerates less than
// prev did: B'P'/L' < BP/L, compared exactly.
func ToleranceShrank(prev, next *Rule) bool {
	if next.Algorithm != GCRA || prev.Algorithm != GCRA {
		return false
	}
	a := new(big.Int).Mul(big.NewInt(next.Burst), big.NewInt(int64(next.Period)))
	a.Mul(a, big.NewInt(prev.Limit))
	b := new(big.Int).Mul(big.NewInt(prev.Burst), big.NewInt(int64(prev.Period)))
	b.Mul(b, big.NewInt(next.Limit))
	return a.Cmp(b) < 0
}

// GCRAClamper is implemented by stores that can cap the TATs of a rule's
// gcra keys; see ClampGCRA.
type GCRAClamper interface {
	// ClampGCRA caps every stored TAT of rule r (a gcra rule with the new
	// numbers) at now + GCRATolerance(r) and returns how many it changed.
	ClampGCRA(ctx context.Context, prefix string, r *Rule) (int, error)
}

// gcraKeyPattern is the SCAN pattern of a rule's gcra keys. Prefixes and
// rule names hold no glob characters (config validation).
func gcraKeyPattern(prefix string, r *Rule) string {
	return prefix + ":{" + r.Name + ":*}:" + GCRA.Suffix()
}

var clampScript = func() *redis.Script {
	src, err := lua.Source("clamp_gcra.lua")
	if err != nil {
		return nil
	}
	return redis.NewScript(src)
}()

// scanner is what ClampGCRA needs from go-redis beyond scripts.
type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// ClampGCRA implements GCRAClamper with SCAN and clamp_gcra.lua, on every
// master of a cluster.
func (s *RedisStore) ClampGCRA(ctx context.Context, prefix string, r *Rule) (int, error) {
	if clampScript == nil {
		return 0, fmt.Errorf("redis store: lua/clamp_gcra.lua missing")
	}
	tau := GCRATolerance(r)
	pattern := gcraKeyPattern(prefix, r)
	var mu sync.Mutex
	total := 0
	clampOn := func(ctx context.Context, sc scanner, run redis.Scripter) error {
		var cursor uint64
		for {
			keys, next, err := sc.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return fmt.Errorf("redis store: scan %s: %w", pattern, err)
			}
			for _, k := range keys {
				n, err := clampScript.Run(ctx, run, []string{k}, tau).Int()
				if err != nil {
					return fmt.Errorf("redis store: clamp %s: %w", k, err)
				}
				mu.Lock()
				total += n
				mu.Unlock()
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return clampOn(ctx, c, cc)
		})
		return total, err
	}
	sc, ok := s.client.(scanner)
	if !ok {
		return 0, fmt.Errorf("redis store: this client cannot SCAN")
	}
	return total, clampOn(ctx, sc, s.client)
}

// ClampGCRA implements GCRAClamper.
func (s *MemoryStore) ClampGCRA(_ context.Context, prefix string, r *Rule) (int, error) {
	tau := GCRATolerance(r)
	head, tail := prefix+":{"+r.Name+":", "}:"+GCRA.Suffix()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for k, st := range sh.m {
			if !strings.HasPrefix(k, head) || !strings.HasSuffix(k, tail) || st.expireUS <= now {
				continue
			}
			if st.a > now+tau || (st.a == now+tau && st.b > 0) {
				st.a, st.b = now+tau, 0
				st.expireUS = now + max(tau, 1)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n, nil
}
