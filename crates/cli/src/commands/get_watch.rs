//! `get -w`: the list as `get` prints it, then a line each time a change
//! alters an object's row (its status, readiness, restarts, node …), until
//! interrupted. A watch the server no longer serves (expired, or the server
//! restarted) is followed by a fresh list, printing only what changed.

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use corral_api::watch::EventType;
use corral_api::{Kind, Object};
use corral_client::Client;
use corral_client::runtime::Scope;
use futures::StreamExt;

use super::get::{row, table};
use crate::output::{Format, render_row};

/// What to watch and how to print it.
pub(super) struct Watch<'a> {
    pub kind: Kind,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub selector: Option<&'a str>,
    pub output: Format,
    pub show_namespace: bool,
}

impl Watch<'_> {
    pub(super) async fn run(&self, client: &Client) -> anyhow::Result<()> {
        let scope = Scope {
            namespace: self.namespace.map(str::to_string),
            selector: self.selector.map(str::to_string),
            ..Scope::all(self.kind)
        };
        let mut printer = Printer::new(self);
        loop {
            let list = client.list_scope_all(&scope).await?;
            printer.list(list.items.iter().filter(|o| self.wanted(o)));
            let stream = client.watch_scope(&scope, list.resource_version).await?;
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) if self.wanted(&event.object) => {
                        printer.change(&event.object, event.event_type == EventType::Deleted);
                    }
                    Ok(_) => {}
                    // Expired, or the server went away: list again.
                    Err(_) => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn wanted(&self, object: &Object) -> bool {
        self.name.is_none_or(|name| object.metadata.name == name)
    }
}

/// Prints rows (or objects) and remembers what it printed for each object.
struct Printer {
    kind: Kind,
    output: Format,
    show_namespace: bool,
    /// Column widths of the first table, kept for every later line.
    widths: Option<Vec<usize>>,
    /// Each object's last printed row without AGE, by uid.
    shown: HashMap<String, Vec<String>>,
}

impl Printer {
    fn new(watch: &Watch<'_>) -> Self {
        Printer {
            kind: watch.kind,
            output: watch.output,
            show_namespace: watch.show_namespace,
            widths: None,
            shown: HashMap::new(),
        }
    }

    fn wide(&self) -> bool {
        self.output == Format::Wide
    }

    /// The first list prints the table with its header; a later one (after
    /// the watch was lost) prints the rows that changed meanwhile.
    fn list<'o>(&mut self, objects: impl Iterator<Item = &'o Object>) {
        let objects: Vec<Object> = objects.cloned().collect();
        if self.widths.is_none() && !self.structured() {
            let table = table(self.kind, &objects, self.show_namespace, self.wide());
            print!("{}", table.render());
            self.widths = Some(table.widths());
            let now = Utc::now();
            for object in &objects {
                let mut cells = row(object, self.show_namespace, self.wide(), now);
                cells.pop();
                self.shown.insert(object.metadata.uid.clone(), cells);
            }
            return;
        }
        for object in &objects {
            self.change(object, false);
        }
    }

    fn structured(&self) -> bool {
        matches!(self.output, Format::Json | Format::Yaml)
    }

    /// Prints `object` if its row changed since it was last printed.
    fn change(&mut self, object: &Object, deleted: bool) {
        if self.structured() {
            self.print_object(object, deleted);
            return;
        }
        let mut cells = row(object, self.show_namespace, self.wide(), Utc::now());
        let age = cells.pop().unwrap_or_default();
        let uid = &object.metadata.uid;
        if deleted {
            self.shown.remove(uid);
            // A pod's STATUS says so; other kinds have none: their name does.
            let name = usize::from(self.show_namespace);
            let (column, text) = if self.kind == Kind::Pod {
                (name + 2, "Deleted".to_string())
            } else {
                (name, format!("{} (deleted)", object.metadata.name))
            };
            if let Some(cell) = cells.get_mut(column) {
                *cell = text;
            }
        } else if self.shown.get(uid) == Some(&cells) {
            return;
        } else {
            self.shown.insert(uid.clone(), cells.clone());
        }
        cells.push(age);
        let widths = self.widths.clone().unwrap_or_default();
        print!("{}", render_row(&cells, &widths));
    }

    /// `-o json`: one object per line; `-o yaml`: documents.
    fn print_object(&self, object: &Object, deleted: bool) {
        let mut value = serde_json::to_value(object).unwrap_or_default();
        if deleted {
            value["deleted"] = true.into();
        }
        match self.output {
            Format::Yaml => {
                if let Ok(text) = serde_yaml_ng::to_string(&value) {
                    print!("---\n{text}");
                }
            }
            _ => println!("{value}"),
        }
    }
}
