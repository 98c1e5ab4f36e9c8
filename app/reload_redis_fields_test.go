package app

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/config"
)

// TestNeedRestartNamesEveryRedisField: docs/operations.md promises that a
// reload names, field by field, every changed setting under redis: that
// it cannot apply (HTTP 409 "partial"). The store is built once, so a
// change to any field of redis: must be named; redis.functions was
// dropped in silence (a 200 "success" that applied nothing). The fields
// are walked by reflection, so a new one without its line fails here.
func TestNeedRestartNamesEveryRedisField(t *testing.T) {
	needRestartForEachField(t, "redis.", func(c *config.Config) reflect.Value { return reflect.ValueOf(&c.Redis).Elem() })
}

// needRestartForEachField changes, one at a time, every field of the
// section of config.Example that section returns (its nested sections
// excepted: their own tests walk them) and fails when needRestart does
// not name a setting starting with prefix. A field of a kind it cannot
// change fails, so that a new kind is taught here, not skipped.
func needRestartForEachField(t *testing.T, prefix string, section func(*config.Config) reflect.Value) {
	t.Helper()
	a := &App{}
	prev := config.Example()
	typ := section(prev).Type()
	for i := range typ.NumField() {
		next := config.Example()
		f := section(next).Field(i)
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Int:
			f.SetInt(f.Int() + 1)
		case reflect.Int64: // time.Duration
			f.SetInt(f.Int() + int64(time.Millisecond))
		case reflect.Slice:
			f.Set(reflect.Append(f, reflect.ValueOf("127.0.0.1:1")))
		case reflect.Struct:
			continue // TLS, Sentinel, Coalesce: compared whole or walked by their own tests
		default:
			t.Fatalf("field %s: kind %s, teach this test to change it", typ.Field(i).Name, f.Kind())
		}
		got := a.needRestart(prev, next)
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, prefix) }) {
			t.Errorf("changing %s%s: needRestart named %v, want the field", prefix, typ.Field(i).Name, got)
		}
	}
}
