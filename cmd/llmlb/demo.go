package main

import (
	"context"
	"errors"
)

func runDemo(ctx context.Context, args []string) error {
	return errors.New("not built yet")
}
