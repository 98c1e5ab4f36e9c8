package redisstore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/limits"
)

// fwCount is the count of the fixed_window record at key (lua/fixed_window.lua),
// whatever the key's name; redis.Nil when there is none.
func fwCount(c redis.Cmdable, key string) (int, error) {
	v, err := c.Get(context.Background(), key).Bytes()
	if err != nil {
		return 0, err
	}
	info, _ := limits.FixedWindow.Info()
	rec, ok := info.DecodeRecord(v)
	if !ok {
		return 0, fmt.Errorf("%s holds %q, not a fixed_window record", key, v)
	}
	return strconv.Atoi(rec["n"])
}

// fwCountText is fwCount as text, "" when there is no record.
func fwCountText(c redis.Cmdable, key string) string {
	n, err := fwCount(c, key)
	if err != nil {
		return ""
	}
	return strconv.Itoa(n)
}
