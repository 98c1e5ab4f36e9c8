package lua

import (
	"github.com/redis/go-redis/v9"
)

// IdentitiesScript changes one stored identity override and announces the
// change (identities.lua): the stores of identity overrides run it for
// every set and delete.
var IdentitiesScript = redis.NewScript(mustSource("identities.lua"))

func mustSource(name string) string {
	s, err := Source(name)
	if err != nil {
		panic(err) // embedded at compile time: a missing file is a build error
	}
	return s
}
