use std::process::ExitCode;

fn main() -> ExitCode {
    outbox_relay::cli::main()
}
