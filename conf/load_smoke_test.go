package conf

import "testing"

func TestShippedFileLoads(t *testing.T) {
	if _, err := Load("seckill.toml", func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
}
