package policy

import (
	"strings"
	"testing"
	"time"
)

// TestProbeGTooLongTTLSaysTheRealBound: a ttl over 400d is refused with
// "must be > 0 and <= 400d"; one over 100000d gets the duration parser's
// "is too long (at most 100000d)", a bound that is not the field's: the
// operator who follows it (ttl 90000d) is refused again. (The config's
// period says the same: "period \"1000000d\" is too long (at most
// 100000d)", then "period must be <= 400d".)
func TestProbeGTooLongTTLSaysTheRealBound(t *testing.T) {
	_, err := ParseOverride([]byte(`{"limit":3,"ttl":"1000000d"}`), time.Now())
	if err == nil {
		t.Fatal("accepted")
	}
	if !strings.Contains(err.Error(), "400d") {
		t.Errorf("error %q does not name the ttl's real bound (400d)", err)
	}
}
