//! `history`, `diff` and `rollback`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use chrono::Utc;
use clap::Args;
use corral_api::{AuthorClass, HistoryQuery, Kind, RevisionRecord};

use super::connect;
use crate::output::{Format, Table, print_structured, timestamp};
use crate::target::Target;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral history pod/web                     revisions of one object
  corral history pod/web --limit 5           its five newest revisions
  corral history --since 1h                  everything that changed in the last hour
  corral history --since 1d --external       only people's changes
  corral history --since 2h --exclude-author scheduler --exclude-author ipam
  corral history --author alice -o json")]
pub struct HistoryArgs {
    /// KIND/NAME for one object's revisions; omit for cluster-wide history.
    target: Option<String>,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    /// Only changes newer than this: a duration (`1h`, `30m`, `2d`) or an RFC 3339 time.
    #[arg(long, value_name = "WHEN")]
    since: Option<String>,
    /// Only changes by this author (repeatable: any of them).
    #[arg(long, value_name = "NAME")]
    author: Vec<String>,
    /// Never changes by this author (repeatable).
    #[arg(long, value_name = "NAME")]
    exclude_author: Vec<String>,
    /// Only changes made by people.
    #[arg(long, conflicts_with = "system")]
    external: bool,
    /// Only changes made by controllers and nodes.
    #[arg(long)]
    system: bool,
    /// Only objects of this kind.
    #[arg(long, value_name = "KIND")]
    kind: Option<String>,
    /// Only the newest N changes that match (still listed oldest first).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
}

pub async fn history(config: Option<PathBuf>, args: HistoryArgs) -> anyhow::Result<()> {
    let class = match (args.external, args.system) {
        (true, _) => Some(AuthorClass::External),
        (_, true) => Some(AuthorClass::System),
        _ => None,
    };
    let since = args.since.as_deref().map(parse_since).transpose()?;
    let kind = args.kind.as_deref().map(str::parse::<Kind>).transpose()?;
    let query = HistoryQuery {
        since,
        authors: args.author.clone(),
        exclude_authors: args.exclude_author.clone(),
        class,
        kind,
        limit: args
            .limit
            .map(|limit| usize::try_from(limit).unwrap_or(usize::MAX)),
    };
    let client = connect(config)?;
    let (records, single) = match &args.target {
        Some(target) => {
            let key = Target::parse(target, None)?.key(Some(&args.namespace))?;
            // Unfiltered, the server reads the newest N alone; a filter
            // needs every revision to find the newest N that match.
            let unfiltered = HistoryQuery {
                limit: None,
                ..query.clone()
            } == HistoryQuery::default();
            let mut records: Vec<RevisionRecord> = match query.limit {
                Some(limit) if unfiltered => client.recent_history(&key, limit).await?,
                _ => client.history(&key).await?,
            };
            records.retain(|r| query.admits(r));
            if let Some(limit) = query.limit {
                records.drain(..records.len().saturating_sub(limit));
            }
            (records, true)
        }
        None => (client.cluster_history(&query).await?, false),
    };
    if print_structured(args.output, &records)? {
        return Ok(());
    }
    if records.is_empty() {
        eprintln!("no changes match");
        return Ok(());
    }
    let mut headers = vec!["TIME"];
    if !single {
        headers.push("OBJECT");
    }
    headers.extend(["REVISION", "AUTHOR", "CLASS", "MESSAGE"]);
    let mut table = Table::new(&headers);
    for record in &records {
        let mut row = vec![timestamp(record.time)];
        if !single {
            let key =
                corral_api::ObjectKey::new(record.kind, Some(&record.namespace), &record.name);
            row.push(key.to_string());
        }
        let revision = if record.deleted {
            format!("{} (deleted)", record.revision)
        } else {
            record.revision.to_string()
        };
        row.extend([
            revision,
            record.author.clone(),
            record.class.as_str().to_string(),
            if record.message.is_empty() {
                "-".into()
            } else {
                record.message.clone()
            },
        ]);
        table.row(row);
    }
    table.print();
    Ok(())
}

fn parse_since(text: &str) -> anyhow::Result<chrono::DateTime<Utc>> {
    if let Ok(time) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    let duration = humantime::parse_duration(text).with_context(|| {
        format!("--since {text:?}: expected a duration like 1h or an RFC 3339 time")
    })?;
    Ok(Utc::now() - chrono::Duration::from_std(duration)?)
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral diff pod/web 1 2             what changed from revision 1 to 2
  corral diff pod/web 1               revision 1 against the current one
  corral diff pd/web 3 4 -o json      the changes, for scripts
  corral diff -f web.yaml             what applying web.yaml would change, and which
                                      containers would restart (exit 1 if anything)")]
pub struct DiffArgs {
    /// KIND/NAME.
    #[arg(required_unless_present = "file")]
    target: Option<String>,
    /// The older revision.
    #[arg(required_unless_present = "file")]
    from: Option<u64>,
    /// The newer revision (default: the current one).
    to: Option<u64>,
    /// Compare a manifest with the live objects instead (YAML or JSON; `-`
    /// reads standard input): nothing is written.
    #[arg(short = 'f', long = "filename", value_name = "FILE", conflicts_with_all = ["target", "from", "to"])]
    file: Option<PathBuf>,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
    #[arg(short = 'o', long, value_enum, default_value_t)]
    output: Format,
}

pub async fn diff(config: Option<PathBuf>, args: DiffArgs) -> anyhow::Result<()> {
    if let Some(file) = &args.file {
        let objects = super::apply::read_manifest(file, Some(&args.namespace))?;
        let changes = super::preview::preview(&connect(config)?, &objects).await?;
        // Like `diff` and `kubectl diff`: 1 when something would change.
        if changes {
            std::process::exit(1);
        }
        return Ok(());
    }
    let (Some(target), Some(from)) = (&args.target, args.from) else {
        bail!("give KIND/NAME FROM [TO], or -f FILE");
    };
    let key = Target::parse(target, None)?.key(Some(&args.namespace))?;
    let diff = connect(config)?.diff(&key, from, args.to).await?;
    if print_structured(args.output, &diff)? {
        return Ok(());
    }
    if diff.changes.is_empty() {
        println!(
            "revisions {} and {} of {key} have the same spec",
            diff.from, diff.to
        );
        return Ok(());
    }
    super::preview::print_unified(&diff.unified);
    Ok(())
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  corral rollback pod/web --to 1 -m \"back to english\"   a new revision with revision 1's spec
  corral rollback pd/web --to 3 -n team-a               in namespace team-a")]
pub struct RollbackArgs {
    /// KIND/NAME.
    target: String,
    /// The revision whose spec to restore.
    #[arg(long, value_name = "N")]
    to: u64,
    /// Why; recorded with the new revision.
    #[arg(short = 'm', long, value_name = "MSG")]
    message: Option<String>,
    #[arg(short = 'n', long, value_name = "NS", default_value = "default")]
    namespace: String,
}

pub async fn rollback(config: Option<PathBuf>, args: RollbackArgs) -> anyhow::Result<()> {
    let key = Target::parse(&args.target, None)?.key(Some(&args.namespace))?;
    if args.to == 0 {
        bail!("--to: revisions start at 1");
    }
    let object = connect(config)?
        .rollback(&key, args.to, args.message.as_deref())
        .await?;
    println!(
        "{key} rolled back to the spec of revision {} (now revision {})",
        args.to, object.metadata.revision
    );
    Ok(())
}
