package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/mindroomd/mindroomd/config"
	"github.com/mindroomd/mindroomd/store"
)

// defaultConfig is the configuration file every command reads unless told
// otherwise.
const defaultConfig = "mindroom.yaml"

// journalFlags are how every command finds the journal: through the
// daemon's configuration (-config), with -storage and -database-url-file
// overriding what it says.
type journalFlags struct {
	config    string
	storage   string
	dbURLFile string
	// optional lets a command that only reads the journal run without a
	// configuration file when -config was not given: the storage then
	// comes from MINDROOM_STORAGE or the default, the database URL from
	// MINDROOM_DATABASE_URL.
	optional  bool
	configSet bool
}

// register adds the flags to fs.
func (j *journalFlags) register(fs *flag.FlagSet, optional bool) {
	j.optional = optional
	fs.StringVar(&j.config, "config", defaultConfig, "the daemon's configuration file")
	fs.StringVar(&j.storage, "storage", "", "the storage directory (overrides the configuration's storage)")
	fs.StringVar(&j.dbURLFile, "database-url-file", "",
		"a file holding the PostgreSQL URL of the journal (overrides the configuration's database_url_file)")
}

// parsed records which flags the command line set, after fs.Parse.
func (j *journalFlags) parsed(fs *flag.FlagSet) {
	fs.Visit(func(f *flag.Flag) { j.configSet = j.configSet || f.Name == "config" })
}

// load reads the configuration and applies the overrides. A command that
// only reads the journal gets a configuration of the environment alone
// when there is no configuration file and -config was not given.
func (j journalFlags) load() (*config.Config, error) {
	cfg, err := config.Load(j.config, nil)
	if err != nil {
		if !j.optional || j.configSet || !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		cfg = &config.Config{Storage: config.DefaultStorage}
		if v := os.Getenv(config.EnvStorage); v != "" {
			cfg.Storage = v
		}
		if v := os.Getenv(config.EnvDatabaseURL); v != "" {
			cfg.DatabaseURL = config.NewSecret(v)
		}
	}
	if j.storage != "" {
		cfg.Storage = j.storage
	}
	if j.dbURLFile != "" {
		url, err := readDatabaseURL(j.dbURLFile)
		if err != nil {
			return nil, err
		}
		cfg.DatabaseURL = config.NewSecret(url)
	}
	return cfg, nil
}

// journalOptions is where cfg keeps the journal.
func journalOptions(cfg *config.Config) store.Options {
	return store.Options{StorageDir: cfg.Storage, DatabaseURL: cfg.DatabaseURL.Reveal()}
}

// readDatabaseURL is the PostgreSQL URL file holds. The error never
// repeats the URL.
func readDatabaseURL(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read the database URL: %w", err)
	}
	url := strings.TrimSpace(string(data))
	if url == "" {
		return "", fmt.Errorf("the database URL file %s is empty", file)
	}
	return url, nil
}
