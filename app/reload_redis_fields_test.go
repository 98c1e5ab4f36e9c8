package app

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rategate/rategate/config"
)

// TestNeedRestartNamesEveryRedisField: docs/operations.md promises that a
// reload names, field by field, every changed setting under redis: that
// it cannot apply (HTTP 409 "partial"). The store is built once, so a
// change to any field of redis: must be named; redis.functions was
// dropped in silence (a 200 "success" that applied nothing). The fields
// are walked by reflection, so a new one without its line fails here.
func TestNeedRestartNamesEveryRedisField(t *testing.T) {
	a := &App{}
	prev := config.Example()
	typ := reflect.TypeOf(prev.Redis)
	for i := range typ.NumField() {
		next := config.Example()
		f := reflect.ValueOf(&next.Redis).Elem().Field(i)
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int64: // time.Duration
			f.SetInt(f.Int() + 1_000_000)
		case reflect.Slice:
			f.Set(reflect.Append(f, reflect.ValueOf("127.0.0.1:1")))
		case reflect.Struct:
			continue // TLS, Sentinel, Coalesce: compared whole or field by field elsewhere
		default:
			t.Fatalf("field %s: kind %s, teach this test to change it", typ.Field(i).Name, f.Kind())
		}
		got := a.needRestart(prev, next)
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "redis.") }) {
			t.Errorf("changing redis.%s: needRestart named %v, want the field", typ.Field(i).Name, got)
		}
	}
}
