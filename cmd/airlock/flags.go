package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/airlockhq/airlock/internal/config"
)

// optionValue is a global flag's value. Every option is parsed by config.Load (from the
// flag, else the environment, else the default), so the flag only keeps the text; its
// type is the name --help prints after the flag ("--lease-max duration").
type optionValue struct {
	text, kind string
}

func (v *optionValue) String() string     { return v.text }
func (v *optionValue) Set(s string) error { v.text = s; return nil }
func (v *optionValue) Type() string       { return v.kind }

// flagKinds names each option's value in --help. An option missing here shows as
// "string".
var flagKinds = map[string]string{
	"database-url":              "dsn",
	"config":                    "file",
	"listen":                    "host:port",
	"public-url":                "url",
	"lease-default":             "duration",
	"lease-max":                 "duration",
	"lease-lifetime-max":        "duration",
	"reclaim-alert-after":       "int",
	"max-body-bytes":            "bytes",
	"api-key-cache-ttl":         "duration",
	"migrate":                   "bool",
	"sqlite-synchronous":        "full|normal",
	"log-level":                 "level",
	"memory-limit":              "size",
	"tracing":                   "off|stdout|otlp",
	"ai-actions-enabled":        "true|false",
	"listen-database-url":       "dsn",
	"database-query-mode":       "mode",
	"audit-key-file":            "file",
	"audit-checkpoint-dir":      "dir",
	"audit-checkpoint-interval": "duration",
}

// addOptionFlag adds o as a flag whose help names its value's kind, its environment
// variable and its default. A bool option is a switch: --migrate means --migrate=true.
func addOptionFlag(fs *pflag.FlagSet, o config.Option) {
	kind := flagKinds[o.Flag]
	if kind == "" {
		kind = "string"
	}
	usage := fmt.Sprintf("%s [%s]", o.Help, o.Env)
	if o.Default != "" {
		usage += fmt.Sprintf(" (default %s)", o.Default)
	}
	f := fs.VarPF(&optionValue{kind: kind}, o.Flag, "", usage)
	if kind == "bool" {
		f.NoOptDefVal = "true"
	}
}
