package config_test

import (
	"fmt"

	"github.com/llmlb/llmlb/internal/config"
)

func ExampleParse() {
	_, err := config.Parse([]byte(`
replicas:
  - url: http://10.0.0.1:8000
routing:
  afinity:
    session_ttl: 90m
scrape:
  interval: 3
`), "llmlb.yaml")
	fmt.Println(err)
	// Output:
	// config: llmlb.yaml: line 5: routing.afinity: unknown key (did you mean "affinity"?)
	// config: llmlb.yaml: line 8: scrape.interval: 3 has no unit: write a duration such as "3s" or "3ms"
}

func ExampleConfig_Validate() {
	cfg := config.Default()
	if err := config.ApplyFlags(&cfg, "", "", []string{"gpu-a=http://10.0.0.1:8000", "gpu-a=localhost:8000"}); err != nil {
		fmt.Println(err)
	}
	fmt.Println(cfg.Validate())
	// Output:
	// config: replicas[1].name: "gpu-a" is also the name of replicas[0]; names must be unique
	// config: replicas[1].url: "localhost:8000" is not an absolute http(s) URL (write e.g. http://10.0.0.5:8000)
}
