package policy

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
)

// FuzzParseOverride feeds arbitrary bodies to PUT /v1/rules/{name}/override's
// parser and checks: no panic; a refusal says why; an accepted override has
// sane fields, survives the JSON round trip it makes through Redis
// unchanged, and either applies to a rule as a rule the config loader
// would accept or is refused with a reason — never a rule out of bounds.
func FuzzParseOverride(f *testing.F) {
	for _, s := range []string{
		`{"limit":100,"period":"1m","burst":100}`, `{"factor":1.5,"reason":"black friday","ttl":"6h"}`,
		`{"limit":1.5}`, `{"limit":"100"}`, `null`, `[]`, `{}`, `{"limit":1}{"limit":2}`, `{"factor":1e309}`,
		`{"period":"0s"}`, `{"ttl":"401d"}`, `{"burst":-1}`, `{"limit":9223372036854775808}`, `{"x":1}`,
	} {
		f.Add([]byte(s))
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	rules := []*limits.Rule{
		{Name: "g", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.GCRA, Limit: 100, Period: time.Minute, Burst: 50, Cost: 1},
		{Name: "w", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.FixedWindow, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1},
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := ParseOverride(body, now)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatalf("%q refused without a reason", body)
			}
			if !reflect.DeepEqual(o, Override{}) {
				t.Fatalf("%q refused but returned %+v", body, o)
			}
			return
		}
		switch {
		case o.Limit == 0 && o.Period == 0 && o.Burst == 0 && o.Factor == 0:
			t.Fatalf("%q accepted changing nothing: %+v", body, o)
		case o.Limit < 0 || o.Burst < 0 || o.Period < 0:
			t.Fatalf("%q accepted a negative field: %+v", body, o)
		case o.Factor < 0 || o.Factor > maxFactor:
			t.Fatalf("%q accepted factor %v", body, o.Factor)
		case len(o.Reason) > maxReasonLen:
			t.Fatalf("%q accepted a %d-byte reason", body, len(o.Reason))
		case !o.SetAt.Equal(now):
			t.Fatalf("%q: set_at %v, want %v", body, o.SetAt, now)
		case o.ExpiresAt != nil && (!o.ExpiresAt.After(now) || o.ExpiresAt.Sub(now) > maxTTL):
			t.Fatalf("%q: expires_at %v out of (now, now+%v]", body, o.ExpiresAt, maxTTL)
		}

		stored, err := json.Marshal(o)
		if err != nil {
			t.Fatalf("%+v does not marshal: %v", o, err)
		}
		var back Override
		if err := json.Unmarshal(stored, &back); err != nil {
			t.Fatalf("stored form %s does not read back: %v", stored, err)
		}
		if back.Limit != o.Limit || back.Period != o.Period || back.Burst != o.Burst || back.Factor != o.Factor ||
			back.Reason != o.Reason || !back.SetAt.Equal(o.SetAt) || (back.ExpiresAt == nil) != (o.ExpiresAt == nil) ||
			(o.ExpiresAt != nil && !back.ExpiresAt.Equal(*o.ExpiresAt)) {
			t.Fatalf("round trip through %s changed %+v into %+v", stored, o, back)
		}

		for _, r := range rules {
			before := *r
			eff, err := Apply(r, &o)
			if !reflect.DeepEqual(before, *r) {
				t.Fatalf("Apply modified the file's rule: %+v -> %+v", before, *r)
			}
			if err != nil {
				if strings.TrimSpace(err.Error()) == "" {
					t.Fatalf("Apply(%s, %+v) refused without a reason", r.Name, o)
				}
				continue
			}
			if cerr := config.CheckRule(eff); cerr != nil {
				t.Fatalf("Apply(%s, %+v) = %+v, which CheckRule refuses: %v", r.Name, o, eff, cerr)
			}
			if eff.Name != r.Name || !reflect.DeepEqual(eff.Key, r.Key) || eff.Algorithm != r.Algorithm {
				t.Fatalf("Apply changed the rule's identity: %+v -> %+v", r, eff)
			}
		}
	})
}
