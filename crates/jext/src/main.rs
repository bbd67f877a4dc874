//! The `jext` command: make, check, inspect and exercise ext4 images with jext.

mod bench;
mod cli;
mod signals;

use clap::Parser;

fn main() {
    let args = cli::Cli::parse();
    std::process::exit(cli::run(args));
}
