package conf

import (
	"log/slog"
	"strings"
)

// Log is the [log] section.
type Log struct {
	// Level is the least severe level written: debug, info, warn or error.
	Level string `toml:"level"`
}

// EnvLogLevel overrides [log] level.
const EnvLogLevel = "SECKILL_LOG_LEVEL"

func defaultLog() Log { return Log{Level: "info"} }

// SlogLevel is Level as a slog.Level (info when invalid; Validate rejects that).
func (l Log) SlogLevel() slog.Level {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.Level)); err != nil {
		return slog.LevelInfo
	}
	return lv
}

func (l *Log) validate(p *problems) {
	switch strings.ToLower(l.Level) {
	case "debug", "info", "warn", "error":
	default:
		p.add("log.level", "must be one of debug, info, warn, error; got %q", l.Level)
	}
}
