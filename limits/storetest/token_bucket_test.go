package storetest

import (
	"testing"
)

func TestTokenBucketStandaloneScript(t *testing.T) {
	gtStandalone(t, "token_bucket.lua", "rg:{demo:1.2.3.4}:tb2")
}
