package testredis

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// KeyState describes what key holds, whatever its type, so that tests can
// compare two keys' state without knowing a record's layout: "none", or the
// type and its contents ("string 0x…" in hex, a hash's fields sorted, a
// sorted set's members with their scores). A key of another type, or a
// failed read, fails the test.
func KeyState(t testing.TB, c redis.Cmdable, key string) string {
	t.Helper()
	ctx := context.Background()
	typ, err := c.Type(ctx, key).Result()
	if err != nil {
		t.Fatalf("TYPE %s: %v", key, err)
	}
	switch typ {
	case "none":
		return "none"
	case "string":
		v, err := c.Get(ctx, key).Bytes()
		if err != nil {
			t.Fatalf("GET %s: %v", key, err)
		}
		return fmt.Sprintf("string %x", v)
	case "hash":
		m, err := c.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatalf("HGETALL %s: %v", key, err)
		}
		fields := make([]string, 0, len(m))
		for f, v := range m {
			fields = append(fields, f+"="+v)
		}
		sort.Strings(fields)
		return "hash " + strings.Join(fields, " ")
	case "zset":
		zs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
		if err != nil {
			t.Fatalf("ZRANGE %s: %v", key, err)
		}
		var b strings.Builder
		b.WriteString("zset")
		for _, z := range zs {
			fmt.Fprintf(&b, " %v@%v", z.Member, z.Score)
		}
		return b.String()
	}
	t.Fatalf("key %s is a %s, which KeyState does not read", key, typ)
	return ""
}
